"""The byte-for-byte relay over the proxy's own upstream client: what it sends the client."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from proxy.config.sections import UpstreamSettings
from proxy.telemetry.exchange import Exchange
from proxy.telemetry.metrics import Metrics
from proxy.upstream.builtin_transport import BuiltinTransport
from proxy.upstream.pool import Upstream
from proxy.upstream.relay import relay
from tests.proxy.upstream.test_builtin_transport import Answer, serving

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
EVENTS = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n'


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def paced(*parts: bytes) -> Answer:
    """Each part of the answer a moment after the one before (the model still writing)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for part in parts:
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(0.05)

    return answer


@pytest.mark.parametrize(
    ("parts", "bodies"),
    [
        # All of the answer in at once: its bytes and the response's end are one send.
        ([HEAD + chunk(EVENTS) + b"0\r\n\r\n"], [(EVENTS, False)]),
        # In pieces: each piece is relayed as it comes, the end follows the last one.
        (
            [HEAD + chunk(EVENTS[:20]), chunk(EVENTS[20:]) + b"0\r\n\r\n"],
            [(EVENTS[:20], True), (EVENTS[20:], False)],
        ),
    ],
    ids=["whole", "in-pieces"],
)
async def test_an_answer_all_in_ends_with_its_last_bytes(
    parts: list[bytes], bodies: list[tuple[bytes, bool]]
) -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    transport = BuiltinTransport(max_connections=2, keepalive_expiry=30.0)
    upstream = Upstream(UpstreamSettings(), transport)
    async with serving(paced(*parts)) as (_, port):
        await relay(
            upstream=upstream,
            metrics=Metrics(),
            send=send,
            method="POST",
            url=f"http://127.0.0.1:{port}/v1/chat/completions",
            headers=[(b"content-type", b"application/json")],
            content=b"{}",
            exchange=Exchange(request_id="r", route="chat", method="POST", started=time.perf_counter()),
            route_headers=None,
        )
    await transport.aclose()
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    received = [(m["body"], m["more_body"]) for m in sent[1:]]
    assert b"".join(body for body, _ in received) == EVENTS
    assert [(b, more) for b, more in received if b or not more] == bodies
