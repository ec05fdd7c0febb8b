"""A request body read from where it stops repeating the conversation's last one.

An agent's next request is its last one with a step added: the same bytes up to the end of
the last message, then the new messages and the closing fields. Parsing the whole body again
costs time in proportion to the conversation (2 MB at 500k tokens), and every message parsed
again is a new object the rest of the request must match against what it knew. So each
conversation's last body is kept with the byte offset where each item of its history list
ends; the next body is compared with it byte for byte (in C, a few microseconds for 100 KB),
the items whose bytes lie wholly in the common prefix are taken as they were parsed (the same
objects), and only the rest is parsed.

Exactness: equal bytes in an equal context are an equal JSON value, so a reused item is
exactly what parsing it again would give. Every parsed piece goes through orjson, as a whole
body does (``wire/json_body.parse_json``); a body orjson cannot read, a history that is not a list,
a duplicate top-level key, anything unexpected, is parsed whole the usual way. Reused objects
are shared between requests, so nothing may change a parsed body in place (the proxy builds
new bodies; ``CPX_VERIFY_KNOWN_BODIES=1`` compares every result with a whole
parse, which the test suite turns on).

Conversations are told apart by the client's ``X-Session-Id``, else by the start of the body
and of its first user message (``key``); two conversations under one key only share less.
"""

from __future__ import annotations

import hashlib
import json
import os
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from policies.conversation import role
from proxy.wire.forwarding import header_value
from proxy.wire.json_body import parse_json

_CHUNK = 16 * 1024
_SCANNER = json.JSONDecoder()
_BLANKS = " \t\n\r"  # JSON's whitespace
_BLANK_BYTES = _BLANKS.encode()


@dataclass(slots=True)
class ParsedBody:
    data: Any
    lenient: bool  # only Python's parser could read it
    marked: bool = False  # its lone surrogates stand as marks (``wire/surrogates.py``)
    # Leading items of the history list taken from the conversation's last body, which its
    # reader found sound then (``checked``).
    known: int = 0
    record: KnownBody | None = None

    def checked(self) -> None:
        """The reader found every item of the history sound: the next body may skip those."""
        if self.record is not None:
            self.record.checked = len(self.record.items)


@dataclass(slots=True)
class KnownBody:
    body: bytes
    field: str
    ends: list[int]  # offset just after each item
    items: list[Any]
    head: dict[str, Any]  # the top-level fields before the history list
    list_end: int  # offset of the history list's "]"
    tail: dict[str, Any]  # the top-level fields after it
    checked: int = 0  # leading items the reader found sound
    reused: int = 0  # leading items taken from the conversation's last body
    # That body's last item with the role "user", when it is one of the reused ones (-1: it had
    # none; None: not known).
    earlier_user: int | None = None
    _last_user: int | None = None
    # The view's items before the client's own last ones, as last sent for this conversation,
    # and their JSON (``wire_bytes``): between compaction points, the same objects each time.
    sent_head: tuple[list[Any], bytes] | None = None

    def last_user(self) -> int:
        """The index of the last item that is an object with the role "user" (-1: none). An
        agent's history grows after its task: when the last body's answer is among the items
        this one shares with it, only the items added since are looked at."""
        if self._last_user is None:
            start = 0 if self.earlier_user is None else self.reused
            items = self.items
            found = next((i for i in range(len(items) - 1, start - 1, -1) if role(items[i]) == "user"), None)
            if found is None:
                found = -1 if self.earlier_user is None else self.earlier_user
            self._last_user = found
        return self._last_user


class Door(Protocol):
    """What the reader needs of a dialect: its name and the field its history is in."""

    @property
    def name(self) -> str: ...

    @property
    def history_field(self) -> str: ...


class _Unexpected(ValueError):
    """The body is not laid out as the fast path reads it: it is parsed whole."""


def common_prefix(a: bytes, b: bytes) -> int:
    """How many leading bytes ``a`` and ``b`` share: compared a chunk at a time, then halved."""
    limit = min(len(a), len(b))
    start = 0
    while start < limit:
        end = min(limit, start + _CHUNK)
        if not a.startswith(b[start:end], start):
            while end - start > 64:
                middle = (start + end) // 2
                if a.startswith(b[start:middle], start):
                    start = middle
                else:
                    end = middle
            while start < end and a[start] == b[start]:
                start += 1
            return start
        start = end
    return limit


class KnownBodies:
    """The last body of recent conversations, least recently used dropped first, bounded in
    conversations and in bytes."""

    def __init__(self, max_bodies: int = 10_000, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_bodies = max_bodies
        self.max_bytes = max_bytes
        self.verify = os.environ.get("CPX_VERIFY_KNOWN_BODIES") == "1"
        self._known: OrderedDict[bytes, KnownBody] = OrderedDict()
        self._bytes = 0

    @staticmethod
    def key(tenant: str, door: str, session: bytes | None, body: bytes) -> bytes:
        """A conversation's key: its ``X-Session-Id``, else its first bytes and those of its
        first user message (which differ between conversations sharing a system prompt)."""
        if session:
            return b"\x1f".join((tenant.encode(), door.encode(), b"s", session))
        user = body.find(b'"user"')
        user_start = body[user : user + 1024] if user >= 0 else b""
        digest = hashlib.blake2b(body[:256] + b"\x1f" + user_start, digest_size=16).digest()
        return b"\x1f".join((tenant.encode(), door.encode(), b"b", digest))

    def __len__(self) -> int:
        return len(self._known)

    def read(
        self, tenant: str, door: Door, headers: Sequence[tuple[bytes, bytes]], body: bytes
    ) -> ParsedBody:
        """A request's body, under its conversation's ``key``."""
        session = header_value(headers, b"x-session-id")
        return self.parse(self.key(tenant, door.name, session, body), body, door.history_field)

    def parse(self, key: bytes, body: bytes, field: str) -> ParsedBody:
        """``body`` parsed, reusing the items of its history list ``field`` it shares with the
        last body under ``key``; remembered for the next one."""
        known = self._known.get(key)
        parsed: ParsedBody | None = None
        if known is not None and known.field == field:
            try:
                parsed, record = self._warm(known, body)
            except (_Unexpected, ValueError, RecursionError):
                parsed = None
        if parsed is None:
            data, lenient, marked = parse_json(body)
            record = None if lenient else _cold_record(body, data, field)
            parsed = ParsedBody(data, lenient, marked, 0, record)
        if self.verify and not parsed.lenient and parsed.data != orjson.loads(body):
            raise AssertionError("a body read from its known prefix differs from its whole parse")
        self._remember(key, record)
        return parsed

    def _warm(self, known: KnownBody, body: bytes) -> tuple[ParsedBody | None, KnownBody | None]:
        shared = common_prefix(body, known.body)
        # An item is reused when its bytes are shared and it is whole: it closes (an object, an
        # array, a string), or the byte after it is shared too ("12" may go on as "123"). Items
        # recorded at one end (appended together) are reused together.
        reused = bisect_left(known.ends, shared)
        if reused < len(known.ends) and known.ends[reused] == shared and known.body[shared - 1] in b'}]"':
            reused = bisect_right(known.ends, shared)
        if reused == 0:
            return None, None
        items = known.items[:reused]
        ends = known.ends[:reused]
        rest = _appended(body, known, items, ends) or _read_rest(body, ends[-1], items, ends)
        list_end, tail = rest
        if known.field in tail:
            raise _Unexpected("the history field appears twice")
        data = {**known.head, known.field: items, **tail}
        earlier = known._last_user if known._last_user is not None and known._last_user < reused else None
        record = KnownBody(
            body, known.field, ends, items, known.head, list_end, tail, reused=reused, earlier_user=earlier
        )
        record.sent_head = known.sent_head
        return ParsedBody(data, False, False, min(reused, known.checked), record), record

    def _remember(self, key: bytes, record: KnownBody | None) -> None:
        dropped = self._known.pop(key, None)
        if dropped is not None:
            self._bytes -= len(dropped.body)
        if record is None or len(record.body) > self.max_bytes // 4:
            return
        self._known[key] = record
        self._bytes += len(record.body)
        while self._known and (len(self._known) > self.max_bodies or self._bytes > self.max_bytes):
            _, old = self._known.popitem(last=False)
            self._bytes -= len(old.body)


class _Text:
    """A stretch of the body as text for Python's JSON scanner, with its byte offsets."""

    def __init__(self, body: bytes, start: int) -> None:
        self.text = body[start:].decode("utf-8")
        self.start = start
        self.ascii = self.text.isascii()
        self._char, self._byte = 0, start  # the last position converted

    def byte_at(self, char: int) -> int:
        if self.ascii:
            return self.start + char
        if char < self._char:
            self._char, self._byte = 0, self.start
        self._byte += len(self.text[self._char : char].encode("utf-8"))
        self._char = char
        return self._byte

    def skip_blanks(self, char: int) -> int:
        while char < len(self.text) and self.text[char] in _BLANKS:
            char += 1
        return char


def _appended(
    body: bytes, known: KnownBody, items: list[Any], ends: list[int]
) -> tuple[int, dict[str, Any]] | None:
    """The usual next body: items appended to the history and the same fields after it. Then
    what lies between the last reused item and those closing bytes is the new items, parsed
    in one call (wrapped as an array, which is valid only if they are whole values separated
    by commas, so the body is as valid as the last one). Their ends are not told apart: each
    is recorded at the last one's, so a later body reuses them together or not at all."""
    closing = known.body[known.list_end :]
    after = ends[-1]
    list_end = len(body) - len(closing)
    if list_end < after or not body.endswith(closing):
        return None
    between = body[after:list_end].rstrip(_BLANK_BYTES)
    new_items = between.lstrip(_BLANK_BYTES)
    if new_items:
        if not new_items.startswith(b","):
            return None
        try:
            new = orjson.loads(b"[" + new_items[1:] + b"]")
        except orjson.JSONDecodeError:
            return None
        if not isinstance(new, list) or not new:
            return None  # a comma and nothing after it
        items += new
        ends += [after + len(between)] * len(new)
    return list_end, known.tail


def _read_rest(body: bytes, after: int, items: list[Any], ends: list[int]) -> tuple[int, dict[str, Any]]:
    """The history's items after byte ``after`` (the end of the last reused one), appended to
    ``items`` and ``ends``; where the list ends and the top-level fields after it, parsed."""
    text = _Text(body, after)
    char = text.skip_blanks(0)
    while char < len(text.text) and text.text[char] == ",":
        start = text.skip_blanks(char + 1)
        _, end = _SCANNER.raw_decode(text.text, start)
        first, last = text.byte_at(start), text.byte_at(end)
        items.append(orjson.loads(body[first:last]))
        ends.append(last)
        char = text.skip_blanks(end)
    if char >= len(text.text) or text.text[char] != "]":
        raise _Unexpected("the history list does not end where expected")
    list_end = text.byte_at(char)
    char = text.skip_blanks(char + 1)
    rest = body[text.byte_at(char) :]
    if rest.rstrip(_BLANK_BYTES) == b"}":
        return list_end, {}
    if not rest.startswith(b","):
        raise _Unexpected("no field follows the history list")
    tail = orjson.loads(b"{" + rest[1:])
    if not isinstance(tail, dict):
        raise _Unexpected("the fields after the history list are not an object's")
    return list_end, tail


def _cold_record(body: bytes, data: Any, field: str) -> KnownBody | None:
    """Where each item of the history list ``field`` of a wholly parsed body ends, for the next
    body to start from; None for a body the fast path does not read (or does not read here)."""
    if not isinstance(data, dict) or not isinstance(data.get(field), list) or not data[field]:
        return None
    try:
        text = _Text(body, 0)
        char = text.skip_blanks(0)
        if text.text[char] != "{":
            return None
        head: dict[str, Any] = {}
        seen: set[str] = set()
        char = text.skip_blanks(char + 1)
        while True:
            name, char = _SCANNER.raw_decode(text.text, char)
            char = text.skip_blanks(char)
            if text.text[char] != ":" or name in seen:
                return None  # not a key, or a duplicate key: orjson's last value wins
            seen.add(name)
            char = text.skip_blanks(char + 1)
            if name == field:
                return _list_record(body, data, field, text, char, head)
            _, char = _SCANNER.raw_decode(text.text, char)
            head[name] = data[name]
            char = text.skip_blanks(char)
            if text.text[char] != ",":
                return None
            char = text.skip_blanks(char + 1)
    except (ValueError, IndexError, RecursionError):
        return None


def _list_record(
    body: bytes, data: dict[str, Any], field: str, text: _Text, char: int, head: dict[str, Any]
) -> KnownBody | None:
    if text.text[char] != "[":
        return None
    items: list[Any] = data[field]
    ends: list[int] = []
    char = text.skip_blanks(char + 1)
    for index in range(len(items)):
        if index:
            if text.text[char] != ",":
                return None
            char = text.skip_blanks(char + 1)
        _, char = _SCANNER.raw_decode(text.text, char)
        ends.append(text.byte_at(char))
        char = text.skip_blanks(char)
    if text.text[char] != "]":
        return None
    tail = {name: value for name, value in data.items() if name not in head and name != field}
    return KnownBody(body, field, ends, list(items), head, text.byte_at(char), tail)
