"""A request body's JSON as the proxy reads and writes it.

orjson reads and writes every body it can. It refuses two things RFC 8259 allows and real
clients send: a lone UTF-16 surrogate escape (``"\\ud83d"``: Node's ``JSON.stringify`` writes
one when an agent cuts a tool output by UTF-16 length through an emoji) and an integer beyond
64 bits. Python's parser reads both, so such a body is read that way and compacted like any
other; only that path pays for the slower parser. An integer stays an exact ``int``, written
back as its digits (Python's writer, where orjson refuses it). A lone surrogate stands as a
mark while the proxy works (``surrogates.py``), written back as its escape: the upstream
reads the same values the client sent.

What is not JSON, or holds a number no JSON writer gives back as sent (``NaN``, ``Infinity``, a
number out of a double's range, an integer of over 4,000 digits, past Python's conversion
limit), is forwarded exactly as sent, never compacted (``SentAsIs`` names why); so is a body
nested deeper than either parser reads (``NestedTooDeep``).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, NamedTuple

import orjson

from proxy.wire.errors import ProxyError
from proxy.wire.surrogates import Unmarkable, mark, may_hold_lone_surrogates, unmark

# Python converts integers of up to 4,300 digits; a longer one is not written back.
_MAX_INT_DIGITS = 4000
# A lone surrogate in a JSON text Python wrote (unmarked data): it can only stand in a string.
_SURROGATE = re.compile("[\ud800-\udfff]")


class SentAsIs(Exception):
    """A body the proxy reads but would not write back as sent: forwarded as sent, never
    compacted; ``reason`` is the ``x-compaction-skipped`` header's."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NestedTooDeep(SentAsIs):
    """A body nested deeper than either parser reads."""

    def __init__(self, reason: str = "JSON nested too deep to read") -> None:
        super().__init__(reason)


class JsonBody(NamedTuple):
    data: Any
    lenient: bool  # only Python's parser could read it
    marked: bool  # its lone surrogates stand as marks: write it with ``dump_json(marked=True)``


def _exact_int(digits: str) -> int:
    if len(digits) > _MAX_INT_DIGITS:
        raise SentAsIs(f"an integer of over {_MAX_INT_DIGITS:,} digits")
    return int(digits)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise SentAsIs("a number out of a double's range")
    return value


def _not_json(name: str) -> Any:
    raise SentAsIs(f"{name} is not JSON")


def parse_json(body: bytes) -> JsonBody:
    """The parsed body. A body the proxy would not write back as sent raises ``SentAsIs``;
    one that is not JSON at all is a 400."""
    try:
        return JsonBody(orjson.loads(body), False, False)
    except orjson.JSONDecodeError:
        pass
    try:
        data = json.loads(body, parse_int=_exact_int, parse_float=_finite_float, parse_constant=_not_json)
        if not may_hold_lone_surrogates(body):
            return JsonBody(data, True, False)
        data, marked = mark(data)
    except RecursionError as exc:
        raise NestedTooDeep() from exc
    except Unmarkable as exc:
        raise SentAsIs("lone surrogates beside private-use characters U+10F800-U+10FFFF") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProxyError(400, "We could not parse the JSON body of your request.") from exc
    return JsonBody(data, True, marked)


def _escaped(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def lenient_text(value: Any) -> str:
    """Compact JSON of what orjson refuses to write (integers beyond 64 bits), by Python."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dump_json(body: Any, marked: bool = False) -> bytes:
    """``body`` as JSON bytes: orjson's, else Python's (a lone surrogate escaped); ``marked``:
    the data of a marked body, whose marks are written as the surrogates' escapes."""
    try:
        text = orjson.dumps(body)
    except TypeError:  # an integer beyond 64 bits
        text = _SURROGATE.sub(_escaped, lenient_text(body)).encode()
    return unmark(text) if marked else text


def json_text(value: Any) -> str:
    """Compact JSON of a value from a body, as a ``str`` to nest in another (a tool call's
    arguments): orjson's, else, for an integer beyond 64 bits, ``lenient_text``. Anything else
    orjson refuses (nesting past its 255 levels: no API's shape) raises its ``TypeError``, and
    the adapter's body goes as sent."""
    try:
        return orjson.dumps(value).decode()
    except TypeError as exc:
        if not str(exc).startswith("Integer"):
            raise
        return lenient_text(value)


def json_value(text: str | bytes) -> Any:
    """A JSON text nested in a body (a tool call's arguments): orjson's read, else Python's
    (integers beyond 64 bits). A text that is not JSON raises ``ValueError``."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)
