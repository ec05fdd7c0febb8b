"""Content digests that identify messages across requests, independent of key order."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import orjson

from policies.conversation import Message


def message_digest(message: Message) -> str:
    return hashlib.blake2b(orjson.dumps(message, option=orjson.OPT_SORT_KEYS), digest_size=16).hexdigest()


def range_digest(messages: Sequence[Message]) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for message in messages:
        digest.update(orjson.dumps(message, option=orjson.OPT_SORT_KEYS))
        digest.update(b"\x1e")
    return digest.hexdigest()


def content_handle(content: str) -> str:
    """Content-addressed handle of an offloaded output: the same output, the same handle."""
    return "out_" + hashlib.blake2b(content.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
