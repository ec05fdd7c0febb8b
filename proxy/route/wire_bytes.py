"""A view's wire body encoded with the client's own trailing items taken from the client's bytes.

After a compaction point, every request's view is the checkpoint's placeholders and summary
followed by the conversation's recent items exactly as the client sent them, and those are most
of its bytes. Encoding them again from the parsed objects reads every string of the session's
recent history from memory that other sessions' requests have long evicted (under 200 sessions,
40-80 µs for a 50 KB view that encodes in 6 µs warm); the same items' bytes are in the request
body that has just arrived. So the longest run of the view's last items that are the client's
own last items (the very objects its body was parsed into, in order) goes out as those bytes,
one ``orjson.Fragment``. What comes before it (the placeholders, the summary, the client's
messages between them) is the same objects from one compaction point to the next: its JSON is
kept with the conversation's record and encoded again only when they change.

Exactness: an object reused from a parse is never changed in place (``proxy/route/known_bodies.py``),
so its bytes in the body are a JSON text of exactly its value: the upstream reads the same body
(the client's spacing inside those items may differ from orjson's). Items appended together are
recorded at one end offset, so the run starts at the first item boundary the record knows.
With ``verify`` (the test suite's ``CPX_VERIFY_KNOWN_BODIES=1``), every spliced body is parsed
back and compared with the plain encoding.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from functools import partial
from typing import Any

import orjson

from proxy.route.known_bodies import KnownBody
from proxy.wire.json_body import dump_json

_BLANK_BYTES = b" \t\n\r"
_COMMA = ord(",")
# A shorter run is encoded with the rest: a fragment saves nothing on a few hundred bytes.
MIN_SPLICED_BYTES = 1024


def client_tail(view_items: list[Any], record: KnownBody) -> tuple[int, bytes] | None:
    """(n, bytes): the view's items from index n on are the client's last items, whose JSON
    text in the request body is ``bytes`` (the items and the commas between them); None when
    there is no such run the record can cut out, or it is too short to be worth it."""
    items, ends = record.items, record.ends
    view_at, client_at = len(view_items), len(items)
    while view_at > 0 and client_at > 0 and view_items[view_at - 1] is items[client_at - 1]:
        view_at -= 1
        client_at -= 1
    # The run starts after a recorded end: items appended together share theirs.
    while client_at < len(items) and (client_at == 0 or ends[client_at - 1] == ends[client_at]):
        view_at += 1
        client_at += 1
    if client_at >= len(items):
        return None
    body, start, end = record.body, ends[client_at - 1], record.list_end
    start = _skip_blanks(body, start, 1)
    if start >= end or body[start] != _COMMA:
        return None
    start, end = _skip_blanks(body, start + 1, 1), _skip_blanks(body, end - 1, -1) + 1
    if end - start < MIN_SPLICED_BYTES:
        return None
    return view_at, body[start:end]  # the one copy of the run


def _skip_blanks(body: bytes, at: int, step: int) -> int:
    """The first offset from ``at`` on (``step`` 1) or back (-1) that is not JSON whitespace."""
    while 0 <= at < len(body) and body[at] in _BLANK_BYTES:
        at += step
    return at


def encode_view(
    body: dict[str, Any], record: KnownBody | None, *, verify: bool = False, marked: bool = False
) -> bytes:
    """``body`` as JSON bytes, its history's trailing client items copied from ``record``'s body
    (the request this view was made from) when the history ends with them. ``marked``: a view
    of a body whose lone surrogates stand as marks (never one with a record: read by Python)."""
    view_items = body.get(record.field) if record is not None else None
    if record is None or not isinstance(view_items, list):
        return dump_json(body, marked)
    tail = client_tail(view_items, record)
    if tail is None:
        return dump_json(body)
    start, run = tail
    try:
        head = _head_json(view_items[:start], record)
        items = [orjson.Fragment(head), orjson.Fragment(run)] if head else [orjson.Fragment(run)]
        spliced = orjson.dumps({**body, record.field: items})
    except TypeError:  # what only the lenient encoder writes
        return dump_json(body)
    if verify and orjson.loads(spliced) != orjson.loads(dump_json(body)):
        raise AssertionError("a view spliced from the client's bytes differs from its encoding")
    return spliced


def _head_json(items: list[Any], record: KnownBody) -> bytes:
    """The JSON of the view's items before the client's run, between the list's brackets (b""
    for none): the conversation's last one when they are the very same objects (a compaction
    point's placeholders and summary, the client's messages between them), else encoded now
    and kept for the next request. Compared by identity: ``1 == True`` in Python, not in JSON."""
    if not items:
        return b""
    sent = record.sent_head
    if sent is not None and len(sent[0]) == len(items) and all(map(operator.is_, sent[0], items)):
        return sent[1]
    encoded = orjson.dumps(items)[1:-1]
    record.sent_head = (items, encoded)
    return encoded


def view_encoder(
    record: KnownBody | None, *, verify: bool = False, marked: bool = False
) -> Callable[[dict[str, Any]], bytes]:
    """``encode_view`` for the views of the request ``record`` was read from (and the bodies of
    its read rounds)."""
    return partial(encode_view, record=record, verify=verify, marked=marked)
