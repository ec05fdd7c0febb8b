"""The response writer: what reaches the client's connection, and in how many sends."""

from __future__ import annotations

import asyncio
from typing import Any

from proxy.wire.response_writer import ResponseWriter


def _run(steps: Any) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def main() -> None:
        writer = ResponseWriter(send)
        writer.start(200, [(b"content-type", b"text/event-stream")], streaming=True)
        await steps(writer)

    asyncio.run(main())
    return sent


def test_writes_held_at_the_end_go_out_with_the_last_bytes_in_one_send() -> None:
    async def steps(writer: ResponseWriter) -> None:
        writer.hold_writes()
        await writer.write(b"data: 1\n\n")
        await writer.write(b"data: 2\n\n")
        await writer.finish(b"data: [DONE]\n\n")

    sent = _run(steps)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[1] == {
        "type": "http.response.body",
        "body": b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n",
        "more_body": False,
    }


def test_released_writes_and_the_end_are_separate_sends() -> None:
    async def steps(writer: ResponseWriter) -> None:
        writer.hold_writes()
        await writer.write(b"data: 1\n\n")
        await writer.release_writes()
        await writer.write(b"data: 2\n\n")
        await writer.finish(b"data: [DONE]\n\n")

    bodies = [m for m in _run(steps) if m["type"] == "http.response.body"]
    assert [(m["body"], m["more_body"]) for m in bodies] == [
        (b"data: 1\n\n", True),
        (b"data: 2\n\n", True),
        (b"data: [DONE]\n\n", False),
    ]


def test_a_response_with_nothing_held_ends_with_its_last_bytes_alone() -> None:
    async def steps(writer: ResponseWriter) -> None:
        await writer.finish(b"{}")

    sent = _run(steps)
    assert sent[-1] == {"type": "http.response.body", "body": b"{}", "more_body": False}
    assert len(sent) == 2
