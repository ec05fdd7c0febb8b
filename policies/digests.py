"""Content digests that identify messages across requests, independent of key order.

A session's checkpoint names messages by digest. Digesting a 120k-token history on every
request would cost more than the rest of the policy, so ``Digests`` remembers the digest of
each text it has seen (keyed by the exact text, like the token-count cache): the next
request of a session only digests its new messages.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import orjson

from policies.conversation import WIRE_ONLY, Message
from policies.text_counts import text_key
from policies.tokens import TokenCounter

# Shapes of tool-call messages whose digests are memoized (any other key: digested in full).
_PLAIN_CALL_MESSAGE = frozenset({"role", "content", "tool_calls", "name", WIRE_ONLY})
_PLAIN_CALL = frozenset({"id", "type", "function"})
_PLAIN_FUNCTION = frozenset({"name", "arguments"})


def _full_digest(message: Any) -> str:
    try:
        data = orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # what only a lenient parser reads: integers past 64 bits, surrogates
        data = json.dumps(message, sort_keys=True, default=repr).encode("utf-8", "surrogatepass")
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class Digests:
    """Bounded two-generation memo of message digests."""

    def __init__(self, max_chars: int = 64 * 1024 * 1024, counter: TokenCounter | None = None) -> None:
        """With ``counter`` (the one that counts the same requests first), the memo keeps the
        counter's own text objects and starts a new generation whenever the counter's text
        caches do: it then holds no text they have dropped, and no second copy of any."""
        self._counter = counter
        self._flips = counter.cache_flips if counter is not None else 0
        self._half = max(1, max_chars // 2)
        self._young: dict[tuple[object, ...], tuple[str, str]] = {}
        self._old: dict[tuple[object, ...], tuple[str, str]] = {}
        self._young_chars = 0
        # Only in a memo for one request (``for_request``): message id -> (message, digest),
        # and the memo its misses go to (which owns the generations).
        self._ids: dict[int, tuple[object, str]] | None = None
        self._base: Digests = self

    def for_request(self) -> Digests:
        """This memo for one request: a request digests the same message objects more than
        once (to find its session, then to re-apply the session's decisions), and each digest
        after the first is one lookup by identity. Drop it with the request."""
        # A plain attribute copy (``copy.copy`` is several times slower; this runs per request).
        scoped = object.__new__(type(self))
        scoped.__dict__.update(self.__dict__)
        scoped._ids = {}
        scoped._base = self
        return scoped

    def remember(self, message: Message, digest: str) -> None:
        """Take ``digest`` as the digest of ``message`` in this request (a memo from
        ``for_request``): the caller knows it from an equal message digested before."""
        if self._ids is not None:
            self._ids[id(message)] = (message, digest)

    def remember_all(self, messages: Sequence[Message], digests: Sequence[str | None]) -> None:
        """``remember`` for each of ``messages`` whose digest in ``digests`` is not None."""
        if self._ids is not None:
            self._ids.update((id(m), (m, d)) for m, d in zip(messages, digests, strict=True) if d is not None)

    def known(self, messages: Sequence[Message]) -> tuple[str | None, ...]:
        """The digest this request took of each of ``messages``, None where it took none."""
        ids = self._ids or {}
        found: list[str | None] = []
        for message in messages:
            entry = ids.get(id(message))
            found.append(entry[1] if entry is not None and entry[0] is message else None)
        return tuple(found)

    def message(self, message: Message) -> str:
        ids = self._ids
        if ids is None:
            return self._digest(message)
        found = ids.get(id(message))
        if found is not None and found[0] is message:
            return found[1]
        digest = self._base._digest(message)
        ids[id(message)] = (message, digest)
        return digest

    def _digest(self, message: Message) -> str:
        if not isinstance(message, dict):
            return _full_digest(message)
        content = message.get("content")
        calls = message.get("tool_calls")
        if calls:
            return self._with_calls(message, content, calls)
        if not isinstance(content, str) or len(message) > 4:
            return _full_digest(message)
        key = (
            str(message.get("role")),
            str(message.get("tool_call_id", "")),
            str(message.get("name", "")),
            ",".join(sorted(message)),
            text_key(content),
        )
        return self._memo(key, content, message)

    def _with_calls(self, message: Message, content: Any, calls: Any) -> str:
        """An assistant message with tool calls, memoized when it has the usual shape (its
        call arguments are texts compared on a hit, like the content)."""
        if (
            not isinstance(calls, list)
            or not (content is None or isinstance(content, str))
            or not _PLAIN_CALL_MESSAGE.issuperset(message)
        ):
            return _full_digest(message)
        wire_only = message.get(WIRE_ONLY, "")
        if not isinstance(wire_only, str):
            return _full_digest(message)
        parts: list[object] = [
            str(message.get("role")),
            "" if content is None else text_key(content),
            text_key(wire_only),
        ]
        texts: list[str] = ["" if content is None else content, wire_only]
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if (
                not isinstance(function, dict)
                or not _PLAIN_CALL.issuperset(call)
                or not _PLAIN_FUNCTION.issuperset(function)
                or not isinstance(function.get("arguments"), str)
            ):
                return _full_digest(message)
            arguments = function["arguments"]
            parts += [
                str(call.get("id")),
                str(call.get("type")),
                str(function.get("name")),
                text_key(arguments),
            ]
            texts.append(arguments)
        key = (",".join(sorted(message)), content is None, *parts)
        return self._memo(key, "\x1f".join(texts), message)

    def _memo(self, key: tuple[object, ...], content: str, message: Message) -> str:
        entry = self._young.get(key) or self._old.get(key)
        if entry is not None and entry[0] == content:
            # Kept as the stored object, not this request's equal copy.
            content, digest = entry
        else:
            digest = _full_digest(message)
            if self._counter is not None:
                content = self._counter.shared_text(content)
        if key not in self._young:
            if self._counter is not None and self._counter.cache_flips != self._flips:
                self._flips = self._counter.cache_flips
                self._old, self._young, self._young_chars = self._young, {}, 0
            self._young[key] = (content, digest)
            self._young_chars += len(content)
            if self._young_chars > self._half:
                self._old, self._young, self._young_chars = self._young, {}, 0
        return digest

    def at(self, index: int, message: Message) -> str:
        """The key of a sticky decision about the client's message at ``index``. The position
        is part of it: an agent can receive the same output twice, and a decision about the
        first copy must not apply to the second."""
        return f"{index}:{self.message(message)}"

    def range(self, messages: Sequence[Message]) -> str:
        digest = hashlib.blake2b(digest_size=16)
        for message in messages:
            digest.update(self.message(message).encode())
        return digest.hexdigest()
