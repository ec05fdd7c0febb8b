"""The chat stream codec, one upstream round fed chunk by chunk as the loop driver feeds it:
a read round's first words held, then plain text relayed chunk by chunk without a parse per
event (the bytes the client gets are the upstream's, the round's text is still exact), and an
event that is more than text (a tool call, the end) taken apart as usual."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from proxy.dialects.chat_stream import ChatStream
from proxy.wire.response_writer import ResponseWriter
from proxy.wire.sse_framer import SSEFramer


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return (
        b"data: "
        + orjson.dumps({"id": "c", "object": "chat.completion.chunk", "choices": [choice]})
        + b"\n\n"
    )


def play(upstream: bytes, size: int = 4096) -> tuple[ChatStream, bytes, int]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def run() -> ChatStream:
        writer = ResponseWriter(send)
        writer.start(200, [], streaming=True)
        stream = ChatStream(writer)
        framer = SSEFramer(1 << 20)
        for start in range(0, len(upstream), size):
            writer.hold_writes()
            await stream.take_all(framer.feed(upstream[start : start + size]))
            await writer.release_writes()
        return stream

    stream = asyncio.run(run())
    bodies = [m for m in sent if m["type"] == "http.response.body"]
    return stream, b"".join(m["body"] for m in bodies), len(bodies)


def test_tiny_deltas_are_relayed_chunk_by_chunk_and_the_text_stays_exact() -> None:
    words = [f"w{n:04d} " for n in range(3000)]
    events = [chunk({"role": "assistant", "content": ""}), *(chunk({"content": w}) for w in words)]
    stream, sent, writes = play(b"".join(events))
    assert sent == b"".join(events)  # byte for byte, nothing parsed away
    assert writes <= len(b"".join(events)) // 4096 + 2  # one write per upstream chunk
    assert stream.text == "".join(words)
    assert stream.calls() == []


def test_an_event_that_is_more_than_text_is_still_taken_apart() -> None:
    text = [chunk({"content": f"part {n} of a long answer. "}) for n in range(200)]
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    # Spelled with spaces, as some providers do: parsed one by one, never relayed unparsed.
    spaced = b'data: {"choices": [{"index": 0, "delta": {"content": "tail"}, "finish_reason": null}]}\n\n'
    upstream = b"".join([*text, spaced, chunk({"tool_calls": [call]}), chunk({}, finish="tool_calls")])
    stream, sent, _ = play(upstream, size=1000)
    assert [c["id"] for c in stream.calls()] == ["call_1"]
    assert b"tool_calls" not in sent  # held until the round ends (a read round is asked again)
    assert stream.text == "".join(f"part {n} of a long answer. " for n in range(200)) + "tail"


def test_tiny_argument_deltas_are_merged_exactly_and_relayed_as_they_came() -> None:
    """Argument pieces of an open call found in raw events, escapes included: the call's
    arguments are exact, and at the round's end the client gets the events byte for byte."""
    opening = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "write", "arguments": ""}}
    arguments = orjson.dumps({"path": "a.py", "text": 'print("hi")\n\t' * 400}).decode()
    pieces = [arguments[n : n + 4] for n in range(0, len(arguments), 4)]
    events = [
        chunk({"role": "assistant", "tool_calls": [opening]}),
        *(chunk({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}) for p in pieces),
        chunk({}, finish="tool_calls"),
    ]
    upstream = b"".join(events) + b"data: [DONE]\n\n"
    sent: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            sent.append(message["body"])

    async def run() -> ChatStream:
        writer = ResponseWriter(send)
        writer.start(200, [], streaming=True)
        stream = ChatStream(writer)
        framer = SSEFramer(1 << 20)
        for start in range(0, len(upstream), 3000):
            await stream.take_all(framer.feed(upstream[start : start + 3000]))
        assert sent == []  # calls are held until the round ends
        assert stream.calls()[0]["function"]["arguments"] == arguments
        assert len(stream.held) < len(pieces) / 10  # raw chunks held, not event by event
        await stream.finish({})
        return stream

    asyncio.run(run())
    assert b"".join(sent) == upstream
