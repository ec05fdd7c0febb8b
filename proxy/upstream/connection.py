"""One upstream HTTP/1.1 connection as an asyncio protocol: httptools' C parser reads the
answers that arrive on it, one exchange at a time (``proxy/upstream/builtin_transport.py`` pools them).

An answer's body is kept as it arrives (reading pauses past 1 MB unread) and taken by the one
reader of the exchange; anything the connection receives that is not the answer to its
current request (a second answer in the same read, bytes on an idle connection, an upgrade)
marks it broken, so it is closed instead of reused.
"""

from __future__ import annotations

import asyncio
import collections
import socket
from collections.abc import Callable

import httptools
import httpx

# Past this much unread body the connection stops reading until the caller catches up.
_PAUSE_BYTES = 1 << 20
# An upstream's answer head larger than this is refused (a misbehaving server, not an answer).
_MAX_HEAD_BYTES = 256 * 1024

PoolKey = tuple[str, str, int]


class UpstreamConnection(asyncio.Protocol):
    """One connection: parses the answers that arrive on it, one exchange at a time."""

    def __init__(self, key: PoolKey, on_idle_close: Callable[[UpstreamConnection], None]) -> None:
        self.key = key
        self.on_idle_close = on_idle_close  # the pool's: an idle connection the server closed
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.head: asyncio.Future[None] | None = None  # set when the answer's head is in
        self.waiter: asyncio.Future[None] | None = None  # the reader waiting for body bytes
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.paused = False
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_bytes = 0
        self.reason = b""
        self.status = 0
        self.keep_alive = False
        self.close_delimited = False  # no length, not chunked: the body ends with the connection
        self.skip_body = False  # the answer to a HEAD request
        self.complete = False
        self.error: BaseException | None = None
        self.closed = False
        self.idle = False  # in the pool
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        raw = transport.get_extra_info("socket")
        if raw is not None and raw.family in (socket.AF_INET, socket.AF_INET6):
            # The head and the body go out in one write, and the answer must not wait for a
            # delayed acknowledgement.
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self.head is None or self.complete:
            # Bytes nobody asked for (an idle connection): it cannot be trusted any more.
            self._fail(httpx.RemoteProtocolError("unexpected data from the upstream"))
            return
        try:
            self.parser.feed_data(data)
        except Exception as exc:  # a malformed answer, an upgrade, a second answer, a huge head
            self._fail(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.idle:
            self.on_idle_close(self)
        if self.close_delimited and self.head is not None and self.head.done() and exc is None:
            self.complete = True
            self._wake()
        elif not self.complete:
            self._fail(exc or ConnectionResetError("the upstream closed the connection"))

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        if self.head is not None and not self.head.done():
            self.head.set_exception(exc)
        self._wake()
        self.close()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # httptools' callbacks
    def on_message_begin(self) -> None:
        if self.complete:
            # More after this exchange's answer (in the same read): the connection is out of
            # step with its requests and never reused.
            raise httptools.HttpParserError("data after the answer")

    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_bytes += len(name) + len(value)
        if self.head_bytes > _MAX_HEAD_BYTES:
            raise httptools.HttpParserError("answer head too large")
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status == 101:  # the proxy never asks to switch protocols
            raise httptools.HttpParserError("an upgrade answer")
        if 100 <= status < 200:
            self.headers, self.reason, self.head_bytes = [], b"", 0  # interim: the answer follows
            return
        self.status = status
        self.keep_alive = self.parser.should_keep_alive()
        fields = {name.lower(): value.lower() for name, value in self.headers}
        chunked = fields.get(b"transfer-encoding", b"").rstrip().endswith(b"chunked")
        self.close_delimited = (
            b"content-length" not in fields
            and not chunked
            and status not in (204, 304)
            and not self.skip_body
        )
        if self.skip_body:
            self.complete = True
            self.keep_alive = False  # the parser would read the next answer as this one's body
        if self.head is not None and not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > _PAUSE_BYTES and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.status:  # not an interim answer's end
            self.complete = True
            self._wake()

    def begin(self, loop: asyncio.AbstractEventLoop, skip_body: bool) -> asyncio.Future[None]:
        """Ready for the next exchange; the future is done when its answer's head is in."""
        self.headers, self.reason, self.head_bytes, self.status = [], b"", 0, 0
        self.complete = self.keep_alive = self.close_delimited = False
        self.skip_body = skip_body
        self.head = loop.create_future()
        return self.head

    def take(self) -> bytes:
        """The body bytes received so far."""
        chunks = self.chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self.buffered = 0
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return data


class Expired(Exception):
    """A timer ran out (the proxy's own, never an operating system's ETIMEDOUT)."""


def expire(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_exception(Expired())
