"""A request body's JSON as the proxy reads and writes it: orjson first, and Python's lenient
parser for what orjson refuses (integers beyond 64 bits, NaN, lone surrogate escapes), so such
a body is still forwarded, as the client sent it; a body nested deeper than both parsers read
is forwarded as sent, never compacted."""

from __future__ import annotations

import json
from typing import Any

import orjson

from proxy.wire.errors import ProxyError


def _lenient_int(digits: str) -> int | str:
    """An integer as Python reads it; past Python's 4,300-digit limit, its digits (the body
    is forwarded as sent, so the value itself is never needed)."""
    return int(digits) if len(digits) <= 4000 else digits


class NestedTooDeep(Exception):
    """A body nested deeper than either parser reads: forwarded as sent, never compacted."""


def parse_json(body: bytes) -> tuple[Any, bool]:
    """The parsed body, and whether only Python's lenient parser could read it. A body nested
    deeper than both parsers go raises ``NestedTooDeep`` (the caller forwards it as sent)."""
    try:
        return orjson.loads(body), False
    except orjson.JSONDecodeError:
        # orjson refuses integers beyond 64 bits, NaN and lone surrogate escapes, which
        # Python's parser reads; such a request is still forwarded, but as the client sent it.
        try:
            return json.loads(body, parse_int=_lenient_int), True
        except RecursionError as exc:
            raise NestedTooDeep() from exc
        except (ValueError, UnicodeDecodeError) as exc:
            raise ProxyError(400, "We could not parse the JSON body of your request.") from exc


def dump_json(body: Any) -> bytes:
    try:
        return orjson.dumps(body)
    except TypeError:  # what only the lenient parser reads
        return json.dumps(body, separators=(",", ":")).encode()
