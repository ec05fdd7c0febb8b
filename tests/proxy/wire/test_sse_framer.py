"""The SSE framer: the same events as splitting the whole stream, whatever the chunking; linear
time on one huge line; a bounded event size."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.wire.sse_framer import EventTooLarge, SSEFramer

STREAM = (
    b'data: {"a": 1}\r\n\r\nevent: message_start\ndata: {"b": 2}\n\n'
    b": ping\n\ndata: [DONE]\r\n\r\ndata: tail-without-end"
)


def reference(raw: bytes) -> list[bytes]:
    *events, rest = raw.replace(b"\r\n", b"\n").split(b"\n\n")
    return [*events, rest]


@given(st.lists(st.integers(min_value=1, max_value=len(STREAM)), max_size=12))
def test_any_chunking_gives_the_events_of_the_whole_stream(cuts: list[int]) -> None:
    framer = SSEFramer(1 << 20)
    events: list[bytes] = []
    previous = 0
    for cut in sorted(set(cuts)):
        events += framer.feed(STREAM[previous:cut])
        previous = cut
    events += framer.feed(STREAM[previous:])
    assert [*events, framer.rest()] == reference(STREAM)


def test_one_huge_line_in_small_chunks_is_linear_and_bounded() -> None:
    framer = SSEFramer(16 << 20)
    chunk = b"x" * 65_536
    started = time.perf_counter()
    with pytest.raises(EventTooLarge):
        for _ in range(400):  # 26 MB without a blank line
            framer.feed(chunk)
    # The old split-the-buffer loop took seconds here; linear scanning takes milliseconds.
    assert time.perf_counter() - started < 2.0


def test_many_tiny_deltas_cost_one_pass() -> None:
    framer = SSEFramer(1 << 20)
    event = b'data: {"choices": [{"delta": {"content": "abcd"}}]}\n\n'
    started = time.perf_counter()
    count = 0
    for _ in range(100_000):
        for piece in (event[:7], event[7:]):
            count += len(framer.feed(piece))
    assert count == 100_000 and time.perf_counter() - started < 5.0


class _Writer:
    started = True

    async def write(self, data: bytes) -> None:
        pass


def test_a_stream_of_tiny_deltas_is_accumulated_in_linear_time() -> None:
    """400 KB of text and of tool arguments in 4-byte deltas: the codec keeps parts and joins
    them once (attribute strings grown with += copied the whole text on every delta)."""
    import asyncio

    import orjson

    from proxy.dialects.chat_stream import ChatStream

    stream = ChatStream(_Writer())  # type: ignore[arg-type]
    text = [b"data: " + orjson.dumps({"choices": [{"delta": {"content": "abcd"}}]}) for _ in range(100_000)]
    call = {"index": 0, "id": "c1", "function": {"name": "bash", "arguments": ""}}
    args = [
        b"data: "
        + orjson.dumps(
            {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "wxyz"}}]}}]}
        )
        for _ in range(100_000)
    ]
    first = b"data: " + orjson.dumps({"choices": [{"delta": {"tool_calls": [call]}}]})

    async def feed() -> None:
        for event in text:
            await stream.take(event)
        await stream.take(first)
        for event in args:
            await stream.take(event)

    started = time.perf_counter()
    asyncio.run(feed())
    assert stream.text == "abcd" * 100_000
    assert stream.calls()[0]["function"]["arguments"] == "wxyz" * 100_000
    assert time.perf_counter() - started < 10.0
