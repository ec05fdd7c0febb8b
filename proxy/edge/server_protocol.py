"""The HTTP/1.1 connection protocol: uvicorn's httptools protocol with limits a proxy needs.

uvicorn reads a request's headers without a size limit or a deadline when it parses with
httptools: a client could send a 150 MB header block, or open hundreds of sockets and trickle
bytes into them for ever (slowloris). This protocol adds, per connection:

- ``max_header_bytes``: the request line and headers together; past it, **431** and close;
- ``header_timeout``: from the connection (or the first byte of the next request on a
  kept-alive one) to the end of the headers; past it, **408** and close;
- ``body_timeout``: the longest wait for the next bytes of a request body; past it, **408**
  (if no response started) and close, which the application sees as a disconnect.

The limits are class attributes set once per process from the settings (``configure``), so
worker processes that build the app from the environment set them too.

Writes made in one turn of the event loop leave as one (``WriteBehind``): uvicorn writes a
response's head, each body part and a chunked body's end separately, and each write to a
socket is a syscall and a TCP segment; a relayed answer that has already arrived is one.

A request body's parts are kept as they arrive and joined once (``BodyParts``): uvicorn grows a
``bytearray`` with each part and copies it again into ``bytes``, which for an agent's body of
100 KB or more in two parts costs tens of microseconds of reallocation and page faults, on
every request.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from proxy.wire.errors import error_body


def _status(code: int, reason: str, message: str) -> bytes:
    body = error_body(message, type="invalid_request_error")
    head = (
        f"HTTP/1.1 {code} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class WriteBehind:
    """A connection's transport whose writes wait for the end of the event loop's turn, then go
    out together. ``close`` sends what waits first; everything else is the transport's own."""

    __slots__ = ("_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] | None = None

    def write(self, data: bytes) -> None:
        if not data:
            return
        if self._pending is None:
            self._pending = [data]
            self._loop.call_soon(self.flush)
        else:
            self._pending.append(data)

    def flush(self) -> None:
        pending, self._pending = self._pending, None
        if pending and not self._transport.is_closing():
            self._transport.writelines(pending)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class BodyParts:
    """The parts of a request body, taken with ``+=`` as uvicorn takes them into its
    ``bytearray``, and turned into ``bytes`` once: a body that came in one part is that part."""

    __slots__ = ("_parts", "_size")

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._size = 0

    def __iadd__(self, part: bytes) -> BodyParts:
        if part:
            self._parts.append(part)
            self._size += len(part)
        return self

    def __len__(self) -> int:
        return self._size

    def __bytes__(self) -> bytes:
        parts = self._parts
        if len(parts) == 1 and type(parts[0]) is bytes:
            return parts[0]
        return b"".join(parts)


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    max_header_bytes: ClassVar[int] = 64 * 1024
    header_timeout: ClassVar[float] = 30.0
    body_timeout: ClassVar[float] = 60.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_bytes = 0
        self._in_headers = True
        self._in_body = False
        self._deadline: asyncio.TimerHandle | None = None

    @classmethod
    def configure(cls, *, max_header_bytes: int, header_timeout: float, body_timeout: float) -> None:
        cls.max_header_bytes = max_header_bytes
        cls.header_timeout = header_timeout
        cls.body_timeout = body_timeout

    def _arm(self, seconds: float, phase: str) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expired, phase)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self, phase: str) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        responding = (
            self.cycle is not None and self.cycle.response_started and not self.cycle.response_complete
        )
        if not responding:
            self.transport.write(
                _status(408, "Request Timeout", f"The request {phase} took too long to arrive.")
            )
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(WriteBehind(transport, self.loop))  # type: ignore[arg-type]
        self._arm(self.header_timeout, "headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_headers:
            if self._deadline is None:  # the first bytes of a request on a kept-alive connection
                self._arm(self.header_timeout, "headers")
            self._header_bytes += len(data)
        elif self._in_body:
            self._arm(self.body_timeout, "body")
        super().data_received(data)
        if (
            self._in_headers
            and self._header_bytes > self.max_header_bytes
            and not self.transport.is_closing()
        ):
            self._disarm()
            self.transport.write(
                _status(431, "Request Header Fields Too Large", "The request headers are too large.")
            )
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers = True
        self._in_body = False

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._header_bytes = 0
        self._in_body = True
        self._arm(self.body_timeout, "body")
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        # uvicorn starts each batch of the body (the request's, or what ``receive`` left) as an
        # empty ``bytearray``: parts are kept instead, and joined once when the app takes them.
        if cycle is not None and not isinstance(cycle.body, BodyParts):
            parts = BodyParts()
            parts += bytes(cycle.body)
            cycle.body = parts  # type: ignore[assignment]
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_body = False
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # Idle on a kept-alive connection: uvicorn's keep-alive timeout applies until the next
        # request's first bytes start its header deadline.
        self._in_headers = True
        self._header_bytes = 0
