"""The proxy's own HTTP/1.1 client for the upstream hop: asyncio protocols and httptools' C
parser (the one the proxy's server side uses), behind the same httpx seam as the others.

Why: a proxy's client does one thing (send a request's bytes, hand back the answer's bytes as
they come), and a general-purpose client does much more per request (request and response
objects, cookie and redirect machinery, its own stream readers). Measured side by side
(``benchmarks/RESULTS.md``, section 17): about a tenth less proxy CPU per agent step than
aiohttp's under the 200-session load, and about 30% less per pass-through request at 30k.

What it does, as the other transports do for a proxy: a keep-alive pool per scheme, host and
port (at most ``max_connections`` in use, idle ones closed after ``keepalive_expiry`` or when
the server closes them); TLS with the system's trust store (``SSL_CERT_FILE`` and
``SSL_CERT_DIR`` apply) and ALPN ``http/1.1``; the URL sent exactly as given; the caller's
headers as they are plus ``host`` and ``content-length``; no cookies, redirects, added headers
or decompression. Bodies framed by ``content-length``, chunked, or the connection's close;
interim 1xx answers skipped. Timeouts as httpx names them: ``connect``, ``read`` (for the
head and between body reads) and ``pool`` (waiting for a connection when all are in use).
Failures are httpx's exceptions carrying their request, the original error as their cause.
A connection is reused only after an answer read to its end.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httptools
import httpx

# Past this much unread body the connection stops reading until the caller catches up.
_PAUSE_BYTES = 1 << 20
# An upstream's answer head larger than this is refused (a misbehaving server, not an answer).
_MAX_HEAD_BYTES = 256 * 1024
_DEFAULT_PORTS = {"http": 80, "https": 443}

PoolKey = tuple[str, str, int]


class _Connection(asyncio.Protocol):
    """One connection: parses the answers that arrive on it, one exchange at a time."""

    def __init__(self, key: PoolKey) -> None:
        self.key = key
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
        except httptools.HttpParserError as exc:
            self._fail(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
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
    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_bytes += len(name) + len(value)
        if self.head_bytes > _MAX_HEAD_BYTES:
            raise httptools.HttpParserError("answer head too large")
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            self.headers, self.reason, self.head_bytes = [], b"", 0  # interim: the answer follows
            return
        self.status = status
        self.keep_alive = self.parser.should_keep_alive()
        names = {name.lower() for name, _ in self.headers}
        self.close_delimited = (
            b"content-length" not in names
            and b"transfer-encoding" not in names
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
        self.complete = False
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


def _expire(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


@dataclass(frozen=True, slots=True)
class _Exchange:
    """What an error report names: the request (made only when one is raised: building an
    ``httpx.Request`` parses its URL, a cost the hot path skips)."""

    method: str
    url: str
    timeouts: dict[str, Any]

    def request(self) -> httpx.Request:
        return httpx.Request(self.method, self.url, extensions={"timeout": self.timeouts})


class _Body(httpx.AsyncByteStream):
    """An answer's body as it arrives; closing it gives the connection back (or closes it)."""

    def __init__(self, pool: BuiltinTransport, conn: _Connection, exchange: _Exchange) -> None:
        self._pool = pool
        self._conn = conn
        self._exchange = exchange
        self._released = False
        self._loop = asyncio.get_running_loop()

    @property
    def url(self) -> str:
        return self._exchange.url

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        loop = asyncio.get_running_loop()
        read = self._exchange.timeouts.get("read")
        while True:
            if conn.chunks:
                yield conn.take()
                continue
            if conn.complete:
                return
            if conn.error is not None:
                raise httpx.RemoteProtocolError(
                    "upstream closed the connection", request=self._exchange.request()
                ) from conn.error
            conn.waiter = loop.create_future()
            timer = loop.call_later(read, _expire, conn.waiter) if read else None
            try:
                await conn.waiter
            except TimeoutError as exc:
                conn.close()
                raise httpx.ReadTimeout("read timeout", request=self._exchange.request()) from exc
            finally:
                conn.waiter = None
                if timer is not None:
                    timer.cancel()

    async def aclose(self) -> None:
        if not self._released:
            self._released = True
            self._pool.release(self._conn)

    def __del__(self) -> None:
        # A body dropped unclosed (the caller failed before closing it): its place in the
        # pool is given back and its connection closed, not leaked.
        if not self._released:
            self._released = True
            self._conn.complete = False
            # The collector may run this on any thread, or after the loop has stopped.
            if not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self._pool.release, self._conn)


class BuiltinTransport(httpx.AsyncBaseTransport):
    def __init__(
        self, *, max_connections: int, keepalive_expiry: float, max_keepalive_connections: int | None = None
    ) -> None:
        self._keepalive = keepalive_expiry
        self._free = asyncio.Semaphore(max_connections)
        self._idle: dict[PoolKey, list[_Connection]] = {}
        # Idle connections kept open, all upstreams together; one more is closed, not kept.
        self._max_idle = max_connections if max_keepalive_connections is None else max_keepalive_connections
        self._idle_count = 0
        self._ssl: ssl.SSLContext | None = None
        # Each upstream URL's pool key, request target and host header, worked out once.
        self._targets: dict[str, tuple[PoolKey, bytes, bytes]] = {}

    def _target(self, url: str) -> tuple[PoolKey, bytes, bytes]:
        found = self._targets.get(url)
        if found is None:
            parts = urlsplit(url)
            if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
                raise ValueError("not an http:// or https:// URL")
            key = (parts.scheme, parts.hostname, parts.port or _DEFAULT_PORTS[parts.scheme])
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            netloc = parts.netloc.rsplit("@", 1)[-1]
            host = netloc.encode("ascii") if netloc.isascii() else netloc.encode("idna")
            found = (key, target.encode("ascii"), host)
            if len(self._targets) < 1024:
                self._targets[url] = found
        return found

    def _tls(self) -> ssl.SSLContext:
        if self._ssl is None:
            context = ssl.create_default_context()
            context.set_alpn_protocols(["http/1.1"])
            self._ssl = context
        return self._ssl

    async def _acquire(self, key: PoolKey, exchange: _Exchange) -> _Connection:
        """A connection to ``key``: an idle one when there is one, else a new one; the caller
        holds one of the pool's ``max_connections`` places."""
        if self._free.locked():
            try:
                await asyncio.wait_for(self._free.acquire(), exchange.timeouts.get("pool"))
            except TimeoutError as exc:
                raise httpx.PoolTimeout("no free connection", request=exchange.request()) from exc
        else:
            await self._free.acquire()
        try:
            return self._idle_connection(key) or await self._connect(key, exchange)
        except BaseException:
            self._free.release()
            raise

    def _idle_connection(self, key: PoolKey) -> _Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            self._idle_count -= 1
            if not conn.closed and now - conn.idle_since < self._keepalive:
                return conn
            conn.close()
        return None

    async def _connect(self, key: PoolKey, exchange: _Exchange) -> _Connection:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        connecting = loop.create_connection(
            lambda: _Connection(key), host, port, ssl=self._tls() if scheme == "https" else None
        )
        try:
            _, conn = await asyncio.wait_for(connecting, exchange.timeouts.get("connect"))
        except TimeoutError as exc:
            raise httpx.ConnectTimeout("connect timeout", request=exchange.request()) from exc
        except OSError as exc:  # DNS, refused, unreachable, TLS (ssl.SSLError is an OSError)
            raise httpx.ConnectError("connection failed", request=exchange.request()) from exc
        return conn

    def release(self, conn: _Connection) -> None:
        """The exchange on ``conn`` is over: back to the pool if its answer was read to the end
        and both sides keep the connection, else closed."""
        self._free.release()
        reusable = conn.complete and not conn.closed and conn.error is None and conn.keep_alive
        if reusable and not conn.chunks and self._idle_count < self._max_idle:
            conn.idle_since = time.monotonic()
            conn.head = None
            self._idle.setdefault(conn.key, []).append(conn)
            self._idle_count += 1
        else:
            conn.close()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        return await self.send(
            request.method, str(request.url), request.headers.raw, request.content, timeouts
        )

    async def send(
        self,
        method: str,
        url: str,
        headers: list[tuple[bytes, bytes]],
        content: bytes,
        timeouts: dict[str, Any],
    ) -> httpx.Response:
        """One exchange; the answer's body is left to stream (close it to free the connection)."""
        exchange = _Exchange(method, url, timeouts)
        try:
            key, target, host = self._target(url)
        except (ValueError, UnicodeEncodeError) as exc:
            raise httpx.UnsupportedProtocol("invalid upstream URL", request=exchange.request()) from exc
        conn = await self._acquire(key, exchange)
        loop = asyncio.get_running_loop()
        head = conn.begin(loop, skip_body=method == "HEAD")
        wire = [method.encode("ascii"), b" ", target, b" HTTP/1.1\r\nhost: ", host, b"\r\n"]
        for name, value in headers:
            if name.lower() not in (b"host", b"content-length"):
                wire += (name, b": ", value, b"\r\n")
        wire += (b"content-length: ", b"%d" % len(content), b"\r\n\r\n")
        read = timeouts.get("read")
        timer = loop.call_later(read, _expire, head) if read else None
        try:
            assert conn.transport is not None
            conn.transport.writelines((b"".join(wire), content))
            await head
        except BaseException as exc:
            self.release(conn)  # not complete: closed
            if isinstance(exc, TimeoutError):
                raise httpx.ReadTimeout("read timeout", request=exchange.request()) from exc
            if isinstance(exc, Exception):
                raise httpx.RemoteProtocolError(
                    "upstream closed the connection", request=exchange.request()
                ) from exc
            raise
        finally:
            if timer is not None:
                timer.cancel()
        return httpx.Response(
            status_code=conn.status,
            headers=conn.headers,
            stream=_Body(self, conn, exchange),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": conn.reason},
        )

    async def aclose(self) -> None:
        for connections in self._idle.values():
            for conn in connections:
                conn.close()
        self._idle.clear()
        self._idle_count = 0
