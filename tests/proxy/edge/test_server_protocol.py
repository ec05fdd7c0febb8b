"""The connection's write-behind transport: the writes of one turn of the event loop leave as
one, in order, and nothing waiting is lost when the connection is closed."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest
import uvicorn

from proxy.edge.server_protocol import BodyParts, LimitedHttpToolsProtocol, WriteBehind


class RecordingTransport:
    def __init__(self) -> None:
        self.sent: list[list[bytes]] = []
        self.closed = False

    def writelines(self, data: list[bytes]) -> None:
        self.sent.append(list(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else None


async def test_writes_of_one_turn_leave_together_and_in_order() -> None:
    real = RecordingTransport()
    transport = WriteBehind(real, asyncio.get_running_loop())  # type: ignore[arg-type]
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    transport.write(b"")
    transport.write(b"5\r\nhello\r\n")
    transport.write(b"0\r\n\r\n")
    assert real.sent == []  # nothing yet: the turn is not over
    await asyncio.sleep(0)
    assert real.sent == [[b"HTTP/1.1 200 OK\r\n\r\n", b"5\r\nhello\r\n", b"0\r\n\r\n"]]
    transport.write(b"later")
    await asyncio.sleep(0)
    assert real.sent[-1] == [b"later"]
    assert transport.get_extra_info("peername") == ("127.0.0.1", 1)  # the rest is the transport's


async def test_close_sends_what_waits_first_and_a_closed_connection_takes_nothing() -> None:
    real = RecordingTransport()
    transport = WriteBehind(real, asyncio.get_running_loop())  # type: ignore[arg-type]
    transport.write(b"HTTP/1.1 408 Request Timeout\r\n\r\n")
    transport.close()
    assert real.sent == [[b"HTTP/1.1 408 Request Timeout\r\n\r\n"]] and real.closed
    transport.write(b"too late")
    await asyncio.sleep(0)
    assert len(real.sent) == 1


def test_body_parts_join_once_and_a_single_part_is_itself() -> None:
    parts = BodyParts()
    assert bytes(parts) == b"" and len(parts) == 0
    only = b"x" * 70_000
    parts += only
    parts += b""
    assert len(parts) == 70_000 and bytes(parts) is only  # no copy of a body in one part
    parts += b"yz"
    assert len(parts) == 70_002 and bytes(parts) == only + b"yz"


async def _echo_digest(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An app answering with the size and digest of the body it received, and in how many
    messages it came."""
    if scope["type"] != "http":
        return
    body, messages = b"", 0
    while True:
        message = await receive()
        body += message.get("body", b"")
        messages += 1
        if not message.get("more_body"):
            break
    answer = f"{len(body)} {hashlib.sha256(body).hexdigest()} {messages}".encode()
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(answer))]}
    )
    await send({"type": "http.response.body", "body": answer})


async def test_a_body_sent_in_pieces_reaches_the_app_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through uvicorn with this protocol: a body of 300 KB written in pieces with pauses
    between them (so it arrives in many reads, past uvicorn's 64 KB pause-reading mark), then
    a small body on the same kept-alive connection; the parts are taken as ``BodyParts``."""
    joined: list[int] = []
    as_bytes = BodyParts.__bytes__
    monkeypatch.setattr(BodyParts, "__bytes__", lambda parts: joined.append(len(parts)) or as_bytes(parts))
    config = uvicorn.Config(
        _echo_digest,
        host="127.0.0.1",
        port=0,
        http=LimitedHttpToolsProtocol,
        log_level="error",
        lifespan="off",
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        big = bytes(range(256)) * 1200
        for body, pieces in ((big, 12), (b'{"small": true}', 1)):
            writer.write(b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: %d\r\n\r\n" % len(body))
            step = -(-len(body) // pieces)
            for start in range(0, len(body), step):
                writer.write(body[start : start + step])
                await writer.drain()
                await asyncio.sleep(0.01)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            size, digest, _ = (await reader.readexactly(length)).decode().split()
            assert (int(size), digest) == (len(body), hashlib.sha256(body).hexdigest())
        writer.close()
        assert sum(joined) == len(big) + len(b'{"small": true}')
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 10)
