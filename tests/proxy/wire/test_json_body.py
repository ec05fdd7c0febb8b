"""A body's JSON read and written: orjson's where it reads the body; Python's for lone surrogate
escapes and integers beyond 64 bits, each written back exactly as the client sent its value;
what no JSON writer gives back as sent is forwarded as sent (``SentAsIs``)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from proxy.wire.json_body import NestedTooDeep, SentAsIs, dump_json, json_text, parse_json
from proxy.wire.surrogates import mark, unmark

# JSON.stringify of a tool output cut by ``.slice`` through an emoji, as Node writes it.
NODE = (
    '{"messages":[{"role":"tool","content":"ok \\ud83d"},{"k":"\\udc00\\ud83d\\ude00 😀"}],'
    '"n":36893488147419103233}'
)


def test_the_common_body_is_orjsons_and_never_marked() -> None:
    body = b'{"messages":[{"role":"user","content":"hi \\ud83d\\ude00"}]}'
    read = parse_json(body)
    assert (read.lenient, read.marked) == (False, False)
    assert dump_json(read.data) == orjson.dumps(orjson.loads(body))


def test_lone_surrogates_stand_as_marks_and_are_written_as_their_escapes() -> None:
    read = parse_json(NODE.encode())
    assert (read.lenient, read.marked) == (True, True)
    text = orjson.dumps(read.data["messages"]).decode()  # marked data is valid Unicode
    assert "\ud83d" not in text and read.data["n"] == 2**65 + 1
    written = dump_json(read.data, marked=True)
    assert json.loads(written) == json.loads(NODE)  # the same values: surrogates, the integer
    assert b'"ok \\ud83d"' in written and b"\\udc00" in written and b":36893488147419103233}" in written
    assert "😀".encode() in written  # a whole emoji is not a surrogate: written as UTF-8


def test_big_integers_are_written_exactly() -> None:
    # orjson reads an integer beyond 64 bits as the nearest float (it refuses none): only a body
    # Python reads (one with a lone surrogate) keeps it exact, and then it is written exactly.
    assert dump_json({"n": 2**80, "s": "\ud83d"}) == b'{"n":1208925819614629174706176,"s":"\\ud83d"}'
    assert json_text({"n": 2**80}) == '{"n":1208925819614629174706176}'


def test_marks_round_trip_every_surrogate() -> None:
    lone = " ".join(chr(c) for c in range(0xD800, 0xE000))  # apart: no two make a pair
    marked, found = mark([lone])
    assert found and not any(0xD800 <= ord(c) < 0xE000 for c in marked[0])
    assert json.loads(unmark(orjson.dumps(marked))) == [lone]


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b'{"t": NaN}', "NaN is not JSON"),
        (b'{"t": -Infinity}', "-Infinity is not JSON"),
        (b'{"t": 1e400}', "a number out of a double's range"),
        (b'{"t": ' + b"9" * 4001 + b"}", "an integer of over 4,000 digits"),
        (
            '{"t": "\\ud800 \U0010f800"}'.encode(),
            "lone surrogates beside private-use characters U+10F800-U+10FFFF",
        ),
    ],
)
def test_what_would_not_be_written_back_as_sent_goes_as_sent(body: bytes, why: str) -> None:
    with pytest.raises(SentAsIs) as raised:
        parse_json(body)
    assert raised.value.reason == why


def test_a_body_nested_too_deep_goes_as_sent() -> None:
    with pytest.raises(NestedTooDeep) as raised:
        parse_json(b"[" * 100_000 + b"]" * 100_000)
    assert raised.value.reason == "JSON nested too deep to read"


def test_nesting_orjson_does_not_write_is_refused_in_a_nested_text() -> None:
    deep: Any = []
    for _ in range(300):
        deep = [deep]
    with pytest.raises(TypeError):
        json_text(deep)
