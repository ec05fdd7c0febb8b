"""A view's wire body encoded with the client's own trailing items taken from the client's bytes.

After a compaction point, every request's view is the checkpoint's placeholders and summary
followed by the conversation's recent items exactly as the client sent them, and those are most
of its bytes. Encoding them again from the parsed objects reads every string of the session's
recent history from memory that other sessions' requests have long evicted (under 200 sessions,
40-80 µs for a 50 KB view that encodes in 6 µs warm); the same items' bytes are in the request
body that has just arrived. So the longest run of the view's last items that are the client's
own last items (the very objects its body was parsed into, in order) goes out as those bytes,
one ``orjson.Fragment``, and only what comes before it is encoded.

Exactness: an object reused from a parse is never changed in place (``proxy/known_bodies.py``),
so its bytes in the body are a JSON text of exactly its value: the upstream reads the same body
(the client's spacing inside those items may differ from orjson's). Items appended together are
recorded at one end offset, so the run starts at the first item boundary the record knows.
With ``verify`` (the test suite's ``CPX_VERIFY_KNOWN_BODIES=1``), every spliced body is parsed
back and compared with the plain encoding.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import orjson

from proxy.exchange import dump_json
from proxy.known_bodies import KnownBody

_BLANK_BYTES = b" \t\n\r"
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
    run = record.body[ends[client_at - 1] : record.list_end].strip(_BLANK_BYTES)
    if not run.startswith(b","):
        return None
    run = run[1:].lstrip(_BLANK_BYTES)
    if len(run) < MIN_SPLICED_BYTES:
        return None
    return view_at, run


def encode_view(body: dict[str, Any], record: KnownBody | None, *, verify: bool = False) -> bytes:
    """``body`` as JSON bytes, its history's trailing client items copied from ``record``'s body
    (the request this view was made from) when the history ends with them."""
    view_items = body.get(record.field) if record is not None else None
    if record is None or not isinstance(view_items, list):
        return dump_json(body)
    tail = client_tail(view_items, record)
    if tail is None:
        return dump_json(body)
    start, run = tail
    try:
        spliced = orjson.dumps({**body, record.field: [*view_items[:start], orjson.Fragment(run)]})
    except TypeError:  # what only the lenient encoder writes
        return dump_json(body)
    if verify and orjson.loads(spliced) != orjson.loads(dump_json(body)):
        raise AssertionError("a view spliced from the client's bytes differs from its encoding")
    return spliced


def view_encoder(record: KnownBody | None, *, verify: bool = False) -> Callable[[dict[str, Any]], bytes]:
    """``encode_view`` for the views of the request ``record`` was read from."""
    return partial(encode_view, record=record, verify=verify)
