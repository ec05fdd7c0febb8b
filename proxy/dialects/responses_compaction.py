"""Remote compaction on the Responses API, answered by the proxy (sans-I/O).

OpenAI compacts a conversation server-side two ways: ``POST /v1/responses/compact`` answers
the input's user messages and one ``compaction`` item (``{"type": "compaction",
"encrypted_content": ...}``); a ``POST /v1/responses`` whose ``input`` holds a
``compaction_trigger`` item (Codex CLI's "remote compaction v2") answers exactly one
``compaction`` output item. The client keeps that item in its history in place of what it
compacted, and sends it back in later requests. No other provider knows either, so the proxy
answers them itself (``route/compact_answer.py``): its own compaction of the input, kept in
the store under a record id, and an item whose ``encrypted_content`` names the record.

That content is ``cpx1.<record>.<mac>``: the record id is random (it says nothing of the
conversation), and the mac, an HMAC-SHA256 of the record with the client's tenant under the
deployment's secret, binds it to the credential that asked for it. An item whose mac does not
verify (forged, altered, another tenant's, another deployment's) is refused with a 400 rather
than sent upstream, where no provider could read it. Here: the item made and verified, the
trigger and the items found in an ``input``, the items put back, and the three answers.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from policies.conversation import role
from proxy.dialects.responses_items import Sources
from proxy.wire.errors import ProxyError
from proxy.wire.sse_framer import typed_event

TRIGGER = "compaction_trigger"
ITEM = "compaction"
PREFIX = "cpx1."
RECORD = re.compile(r"cmp_[0-9a-f]{32}")
# Roles the client keeps itself beside the item (OpenAI's compact answer lists the user
# messages; Codex keeps user, developer and system messages): the item stands for the rest.
CLIENT_KEPT = frozenset({"user", "developer", "system"})
MAC_BYTES = 18


def new_record() -> str:
    return "cmp_" + secrets.token_hex(16)


def _mac(record: str, tenant: str, secret: bytes) -> str:
    signed = hmac.new(secret, f"{PREFIX}{tenant}\x1f{record}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(signed[:MAC_BYTES]).decode()


def seal(record: str, tenant: str, secret: bytes) -> str:
    """The ``encrypted_content`` of the item for ``record``, bound to ``tenant``."""
    return f"{PREFIX}{record}.{_mac(record, tenant, secret)}"


def is_ours(item: Any) -> bool:
    """A ``compaction`` item this proxy made (by its content's prefix; verified apart)."""
    return (
        isinstance(item, dict)
        and item.get("type") == ITEM
        and str(item.get("encrypted_content", "")).startswith(PREFIX)
    )


def is_item(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type") == ITEM


def record_of(item: dict[str, Any], tenant: str, secret: bytes) -> str:
    """The record a ``compaction`` item names, once its mac verifies for ``tenant``; else a 400
    that says why (the request is not sent upstream: no provider could read the item)."""
    content = item.get("encrypted_content")
    record, _, mac = str(content)[len(PREFIX) :].partition(".")
    if not is_ours(item) or not RECORD.fullmatch(record):
        raise refused("was not made by this proxy")
    if not hmac.compare_digest(mac.encode(), _mac(record, tenant, secret).encode()):
        raise refused("does not verify for this API key (altered, or made for another key or proxy)")
    return record


def refused(why: str) -> ProxyError:
    return ProxyError(
        400,
        f"A compaction item in 'input' {why}. Send the history it came with, or compact again.",
        code="invalid_compaction_item",
        param="input",
    )


def has_trigger(items: Any) -> bool:
    return isinstance(items, list) and any(isinstance(i, dict) and i.get("type") == TRIGGER for i in items)


def without_trigger(items: list[Any]) -> list[Any]:
    return [i for i in items if not (isinstance(i, dict) and i.get("type") == TRIGGER)]


def put_back(items: list[Any], found: dict[int, list[Any]]) -> list[Any]:
    """``items`` with each ``compaction`` item at a position of ``found`` replaced by the items
    it stands for."""
    expanded: list[Any] = []
    for position, item in enumerate(items):
        expanded.extend(found.get(position, (item,)))
    return expanded


def item(record: str, content: str) -> dict[str, Any]:
    """The one output item of a compaction answer."""
    return {"id": "cmp_" + record[4:20], "type": ITEM, "encrypted_content": content}


def usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    """The compaction's usage as the Responses API reports it: the input compacted, and what the
    item stands for (what it costs in the next request's input)."""
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


@dataclass(frozen=True, slots=True)
class Answer:
    """A compaction answered by the proxy: its item and usage, for the request's ``body``."""

    body: dict[str, Any]
    item: dict[str, Any]
    usage: dict[str, Any]
    response_id: str = ""
    created: int = 0

    def __post_init__(self) -> None:
        if not self.response_id:
            object.__setattr__(self, "response_id", "resp_" + secrets.token_hex(24))
        if not self.created:
            object.__setattr__(self, "created", int(time.time()))

    def response(self) -> dict[str, Any]:
        """The ``/v1/responses`` answer to a trigger: a completed response, one output item."""
        body = self.body
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created,
            "status": "completed",
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "model": body.get("model"),
            "output": [self.item],
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "store": body.get("store", False),
            "usage": self.usage,
        }

    def events(self) -> bytes:
        """The same answer as the Responses stream writes it."""
        started = {**self.response(), "status": "in_progress", "output": [], "usage": None}
        payloads: list[dict[str, Any]] = [
            {"type": "response.created", "response": started},
            {"type": "response.in_progress", "response": started},
            {"type": "response.output_item.added", "output_index": 0, "item": self.item},
            {"type": "response.output_item.done", "output_index": 0, "item": self.item},
            {"type": "response.completed", "response": self.response()},
        ]
        return b"".join(typed_event({**p, "sequence_number": n}) for n, p in enumerate(payloads))

    def compacted(self, kept: Sequence[Any]) -> dict[str, Any]:
        """The ``/v1/responses/compact`` answer: the user messages ``kept``, then the item."""
        return {
            "id": self.response_id,
            "object": "response.compaction",
            "created_at": self.created,
            "output": [*kept, self.item],
            "usage": self.usage,
        }


def stands_for(
    messages: Sequence[Any], sources: Sources, raw: Sequence[Any], outcome: Any, ours: set[int]
) -> list[tuple[Any, int]]:
    """The messages of a compacted view (``outcome``: its ``messages`` and ``origin``) the
    item stands for, with their origin: all but those the client keeps itself (its own user,
    developer and system messages, ``CLIENT_KEPT``; not one an earlier item put back, whose
    input items' ids are in ``ours``). ``messages``: the request's neutral messages, read from
    ``raw`` (its input) as ``sources`` says. A view the policy left as it came (no stages, or a
    summary larger than the history) is the history."""

    def client_kept(at: int) -> bool:
        if role(messages[at]) not in CLIENT_KEPT:
            return False
        positions = [p for p in sources.items[at] if 0 <= p < len(raw)]
        return not any(id(raw[p]) in ours for p in positions)

    view, origin = outcome.messages, outcome.origin
    if view is None or origin is None:
        view, origin = messages, range(len(messages))
    return [(message, at) for message, at in zip(view, origin, strict=True) if at < 0 or not client_kept(at)]


def user_messages(items: Sequence[Any]) -> list[Any]:
    """The input's user messages, as OpenAI's compact answer lists them."""
    return [
        i
        for i in items
        if isinstance(i, dict) and i.get("role") == "user" and i.get("type", "message") == "message"
    ]


def record_content(items: Sequence[Any]) -> str:
    return orjson.dumps(list(items)).decode()


def items_of(content: str) -> list[Any]:
    loaded = orjson.loads(content)
    if not isinstance(loaded, list):
        raise ValueError("a compaction record holds a list of items")
    return loaded


@dataclass(frozen=True, slots=True)
class RemoteCompaction:
    """What a door's adapter says of remote compaction: ``endpoint``, every request is one
    (``/v1/responses/compact``); else a request is one when its ``input`` holds a trigger."""

    endpoint: bool = False

    def wanted(self, body: dict[str, Any]) -> bool:
        return self.endpoint or has_trigger(body.get("input"))
