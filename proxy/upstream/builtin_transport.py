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
A connection is reused only after an answer read to its end with nothing after it (one
connection's parsing: ``proxy/upstream/connection.py``).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from proxy.upstream.connection import Expired, PoolKey, UpstreamConnection, expire
from proxy.upstream.parts_transport import PartsTransport, request_for_report

_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class _Exchange:
    """What an error report names: the request (made only when one is raised: building an
    ``httpx.Request`` parses its URL, a cost the hot path skips)."""

    method: str
    url: str
    timeouts: dict[str, Any]

    def request(self) -> httpx.Request:
        return request_for_report(self.method, self.url, self.timeouts)


class _Body(httpx.AsyncByteStream):
    """An answer's body as it arrives; closing it gives the connection back (or closes it)."""

    def __init__(self, pool: BuiltinTransport, conn: UpstreamConnection, exchange: _Exchange) -> None:
        self._pool = pool
        self._conn = conn
        self._exchange = exchange
        self._released = False
        self._loop = asyncio.get_running_loop()

    @property
    def url(self) -> str:
        return self._exchange.url

    @property
    def drained(self) -> bool:
        """The whole answer has arrived and every byte of it was taken: the chunk just taken
        was the last one."""
        return self._conn.complete and not self._conn.chunks

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
            timer = loop.call_later(read, expire, conn.waiter) if read else None
            try:
                await conn.waiter
            except Expired as exc:
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


class BuiltinTransport(PartsTransport):
    def __init__(
        self, *, max_connections: int, keepalive_expiry: float, max_keepalive_connections: int | None = None
    ) -> None:
        self._keepalive = keepalive_expiry
        self._free = asyncio.Semaphore(max_connections)
        self._idle: dict[PoolKey, list[UpstreamConnection]] = {}
        # Idle connections kept open, all upstreams together; one more is closed, not kept.
        self._max_idle = max_connections if max_keepalive_connections is None else max_keepalive_connections
        self._swept = time.monotonic()
        self._closed = False
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
            netloc = netloc.removesuffix(f":{_DEFAULT_PORTS[parts.scheme]}")  # as other clients send it
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

    async def _acquire(self, key: PoolKey, exchange: _Exchange) -> UpstreamConnection:
        """A connection to ``key``: an idle one when there is one, else a new one; the caller
        holds one of the pool's ``max_connections`` places."""
        if self._free.locked():
            try:
                async with asyncio.timeout(exchange.timeouts.get("pool")):
                    await self._free.acquire()
            except TimeoutError as exc:
                raise httpx.PoolTimeout("no free connection", request=exchange.request()) from exc
        else:
            await self._free.acquire()
        try:
            return self._idle_connection(key) or await self._connect(key, exchange)
        except BaseException:
            self._free.release()
            raise

    def _idle_connection(self, key: PoolKey) -> UpstreamConnection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            conn.idle = False
            if not conn.closed and now - conn.idle_since < self._keepalive:
                return conn
            conn.close()
        return None

    def _forget(self, conn: UpstreamConnection) -> None:
        """``conn`` leaves the idle ones (the server closed it, or it makes room)."""
        conn.idle = False
        idle = self._idle.get(conn.key)
        if idle is not None and conn in idle:
            idle.remove(conn)

    def _evict(self, now: float) -> None:
        """Make room among the idle connections: the expired ones of every upstream (once per
        ``keepalive_expiry`` at most), then the oldest one if they are still at the limit."""
        if now - self._swept >= self._keepalive:
            self._swept = now
            for conns in self._idle.values():
                for conn in [c for c in conns if now - c.idle_since >= self._keepalive]:
                    self._forget(conn)
                    conn.close()
        oldest = [conns[0] for conns in self._idle.values() if conns]
        if oldest and sum(map(len, self._idle.values())) >= self._max_idle:
            conn = min(oldest, key=lambda c: c.idle_since)
            self._forget(conn)
            conn.close()

    async def _connect(self, key: PoolKey, exchange: _Exchange) -> UpstreamConnection:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        tls = self._tls() if scheme == "https" else None
        try:
            async with asyncio.timeout(exchange.timeouts.get("connect")):
                _, conn = await loop.create_connection(
                    lambda: UpstreamConnection(key, self._forget), host, port, ssl=tls
                )
        except TimeoutError as exc:
            raise httpx.ConnectTimeout("connect timeout", request=exchange.request()) from exc
        except OSError as exc:  # DNS, refused, unreachable, TLS (ssl.SSLError is an OSError)
            raise httpx.ConnectError("connection failed", request=exchange.request()) from exc
        return conn

    def release(self, conn: UpstreamConnection) -> None:
        """The exchange on ``conn`` is over: back to the pool if its answer was read to the end
        and both sides keep the connection, else closed."""
        self._free.release()
        reusable = conn.complete and not conn.closed and conn.error is None and conn.keep_alive
        if reusable and not conn.chunks and not self._closed and self._max_idle > 0:
            now = time.monotonic()
            self._evict(now)
            conn.idle_since, conn.idle, conn.head = now, True, None
            self._idle.setdefault(conn.key, []).append(conn)
        else:
            conn.close()

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
        timer = None
        try:
            head = conn.begin(loop, skip_body=method == "HEAD")
            wire = [method.encode("ascii"), b" ", target, b" HTTP/1.1\r\nhost: ", host, b"\r\n"]
            for name, value in headers:
                if name.lower() not in (b"host", b"content-length"):
                    wire += (name, b": ", value, b"\r\n")
            wire += (b"content-length: ", b"%d" % len(content), b"\r\n\r\n")
            read = timeouts.get("read")
            timer = loop.call_later(read, expire, head) if read else None
            assert conn.transport is not None
            conn.transport.writelines((b"".join(wire), content))
            await head
        except BaseException as exc:
            self.release(conn)  # not complete: closed
            if isinstance(exc, Expired):
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
        self._closed = True  # answers still streaming close their connections when done
        for connections in self._idle.values():
            for conn in connections:
                conn.close()
        self._idle.clear()
