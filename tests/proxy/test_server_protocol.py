"""The connection's write-behind transport: the writes of one turn of the event loop leave as
one, in order, and nothing waiting is lost when the connection is closed."""

from __future__ import annotations

import asyncio
from typing import Any

from proxy.server_protocol import WriteBehind


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
