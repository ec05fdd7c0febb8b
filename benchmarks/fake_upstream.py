"""A fast fake OpenAI upstream for the overhead benchmark (stdlib only, uvloop if installed).

Why not the aiohttp fake of ``tests/``: the benchmark subtracts the direct latency from
the proxied one, so the upstream must cost as little and vary as little as possible. This
server is a raw ``asyncio.Protocol``: a request is a search for the end of the head plus a
Content-Length (or chunked) body read, every response is a byte string built at start-up,
and the body is never JSON-parsed (``"stream": true`` is found by a byte search).

Routes:

* ``POST .../chat/completions``: reads the whole body, waits ``--delay-ms``, then answers a
  fixed ``chat.completion``, or with ``"stream": true`` ``--chunks`` SSE
  ``chat.completion.chunk`` events (``--chunk-interval-ms`` apart) and ``data: [DONE]``.
* ``POST .../messages`` (Anthropic) and ``POST .../responses``: the same reply as a Messages
  ``message`` or a Responses ``response`` object, or with ``"stream": true`` that format's
  event stream (built the same way, all at once).
* ``GET /stats``: ``{"requests", "stream_requests", "body_bytes"}`` of chat requests;
  ``POST /stats/reset`` zeroes them. ``GET /healthz``: ``{"status": "ok"}``.

Run: ``python benchmarks/fake_upstream.py --host 127.0.0.1 --port 18000``.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import json
import re
import signal
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, cast

from fake_payloads import anthropic_payloads, build_payloads, responses_payloads

MAX_HEAD = 64 * 1024
_STREAM_KEY = re.compile(rb'"stream"\s*:\s*')
_SEAM = 64  # bytes looked at on each side of the boundary between two reads
_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 431: b"Request Header Fields Too Large"}


@dataclass
class Stats:
    """Counters a benchmark reads to check what actually reached the upstream."""

    requests: int = 0
    stream_requests: int = 0
    body_bytes: int = 0

    def to_json(self) -> bytes:
        fields = {"requests": self.requests, "stream_requests": self.stream_requests}
        return json.dumps({**fields, "body_bytes": self.body_bytes}).encode()


def _chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk of a chunked response."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def _head(status: int, content_type: bytes, length: int | None, keep_alive: bool) -> bytes:
    lines = [b"HTTP/1.1 %d %s" % (status, _REASONS.get(status, b"Unknown")), b"content-type: " + content_type]
    lines.append(b"content-length: %d" % length if length is not None else b"transfer-encoding: chunked")
    lines.append(b"x-request-id: req_bench0001")
    if not keep_alive:
        lines.append(b"connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


@dataclass
class Request:
    """The parts of a request head this server looks at."""

    method: bytes
    path: bytes
    keep_alive: bool
    length: int
    chunked: bool


def parse_head(head: bytes) -> Request | None:
    """Parse a request head (without its final blank line); ``None`` if malformed."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3:
        return None
    method, target, version = parts
    request = Request(method, target.split(b"?", 1)[0], version == b"HTTP/1.1", 0, False)
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"content-length":
            if not value.isdigit():
                return None
            request.length = int(value)
        elif name == b"transfer-encoding":
            request.chunked = b"chunked" in value
        elif name == b"connection":
            request.keep_alive = value != b"close" and (request.keep_alive or value == b"keep-alive")
    return request


def take_chunked(buffer: bytearray) -> bytes | None:
    """Remove a complete chunked body from ``buffer`` and return it, or ``None`` if incomplete.

    Rescanning from the start on every call is cheap: it hops from size line to size line.
    """
    parts: list[bytes] = []
    position = 0
    while True:
        line_end = buffer.find(b"\r\n", position)
        if line_end < 0:
            return None
        size = int(bytes(buffer[position:line_end]).split(b";", 1)[0] or b"0", 16)
        if size == 0:
            trailer_end = buffer.find(b"\r\n\r\n", line_end)
            if trailer_end < 0:
                return None
            del buffer[: trailer_end + 4]
            return b"".join(parts)
        start = line_end + 2
        if len(buffer) < start + size + 2:
            return None
        parts.append(bytes(buffer[start : start + size]))
        position = start + size + 2


def _last_stream_key(data: bytes) -> bool | None:
    """The value of the last ``"stream":`` key in ``data`` (is it ``true``?), ``None`` if none.

    Inside a JSON string a quote is escaped, so ``"stream"`` followed by a colon is a key.
    """
    position = data.rfind(b'"stream"')
    while position >= 0:
        key = _STREAM_KEY.match(data, position)
        if key:
            return data.startswith(b"true", key.end())
        position = data.rfind(b'"stream"', 0, position)
    return None


def wants_stream(parts: list[bytes]) -> bool:
    """Whether the body (as received, in parts) asks for a stream, without parsing or even
    joining it: the last ``"stream":`` key decides. Clients put it after the messages, so
    the backward search usually stops within the last few hundred bytes."""
    for index in range(len(parts) - 1, -1, -1):
        if index + 1 < len(parts):  # a key cut in two by the boundary between reads
            found = _last_stream_key(parts[index][-_SEAM:] + parts[index + 1][:_SEAM])
            if found is not None:
                return found
        found = _last_stream_key(parts[index])
        if found is not None:
            return found
    return False


class UpstreamProtocol(asyncio.Protocol):
    """One client connection: HTTP/1.1 keep-alive, one request at a time, in order."""

    def __init__(self, server: FakeUpstream) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.request: Request | None = None
        self.body_parts: list[bytes] = []
        self.body_size = 0
        self.busy = False  # a delayed or paced response is in progress

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        request = self.request
        if request is not None and not request.chunked and not self.buffer and not self.busy:
            # Body bytes of a Content-Length request are kept as received: no copying.
            needed = request.length - self.body_size
            if len(data) <= needed:
                self.body_parts.append(data)
                self.body_size += len(data)
                if self.body_size == request.length:
                    self._complete(self.body_parts)
                return
        self.buffer += data
        self._process()

    def _process(self) -> None:
        while not self.busy and self.transport is not None:
            if self.request is None:
                end = self.buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(self.buffer) > MAX_HEAD:
                        self.send(_head(431, b"text/plain", 0, False), close=True)
                    return
                self.request = parse_head(bytes(self.buffer[:end]))
                del self.buffer[: end + 4]
                if self.request is None:
                    self.send(_head(400, b"text/plain", 0, False), close=True)
                    return
                self.body_parts, self.body_size = [], 0
            if self.request.chunked:
                chunked = take_chunked(self.buffer)
                if chunked is None:
                    return
                parts = [chunked]
            else:
                needed = self.request.length - self.body_size
                self.body_parts.append(bytes(self.buffer[:needed]))
                self.body_size += len(self.body_parts[-1])
                del self.buffer[:needed]
                if self.body_size < self.request.length:
                    return
                parts = self.body_parts
            self._complete(parts)

    def _complete(self, parts: list[bytes]) -> None:
        request = self.request
        assert request is not None
        self.request, self.body_parts, self.body_size = None, [], 0
        self.server.respond(self, request, parts)

    def send(self, data: bytes, close: bool = False) -> None:
        if self.transport is None:
            return
        self.transport.write(data)
        if close:
            self.transport.close()
            self.transport = None

    def finish_response(self) -> None:
        """Called when a delayed or paced response is complete: serve what is queued."""
        self.busy = False
        if self.buffer:
            self._process()


class FakeUpstream:
    """The routes, the counters and the response timing."""

    def __init__(self, chunks: int = 8, chunk_interval: float = 0.0, delay: float = 0.0) -> None:
        self.payloads = build_payloads(chunks)
        self.chunk_interval = chunk_interval
        self.delay = delay
        self.stats = Stats()
        self._tasks: set[asyncio.Task[None]] = set()
        completion = self.payloads.completion
        self._completion = _head(200, b"application/json", len(completion), True) + completion
        events = b"".join(_chunk(e) for e in self.payloads.stream_events)
        self._stream_all = _head(200, b"text/event-stream", None, True) + events + b"0\r\n\r\n"
        # Other formats' answers, whole: (plain, streamed) by path suffix.
        self._formats: dict[bytes, tuple[bytes, bytes]] = {}
        for suffix, payloads in (
            (b"/messages", anthropic_payloads(chunks)),
            (b"/responses", responses_payloads(chunks)),
        ):
            plain = _head(200, b"application/json", len(payloads.completion), True) + payloads.completion
            streamed = b"".join(_chunk(e) for e in payloads.stream_events)
            self._formats[suffix] = (
                plain,
                _head(200, b"text/event-stream", None, True) + streamed + b"0\r\n\r\n",
            )

    def respond(self, conn: UpstreamProtocol, request: Request, parts: list[bytes]) -> None:
        path, method = request.path, request.method
        suffix = next((s for s in self._formats if path.split(b"?", 1)[0].endswith(s)), None)
        if method == b"POST" and suffix is not None and request.keep_alive:
            stream = wants_stream(parts)
            self.stats.requests += 1
            self.stats.stream_requests += stream
            self.stats.body_bytes += sum(len(part) for part in parts)
            plain, streamed = self._formats[suffix]
            conn.send(streamed if stream else plain)
            return
        if method == b"POST" and path.endswith(b"/chat/completions"):
            stream = wants_stream(parts)
            self.stats.requests += 1
            self.stats.stream_requests += stream
            self.stats.body_bytes += sum(len(part) for part in parts)
            if not request.keep_alive or self.delay or (stream and self.chunk_interval):
                conn.busy = True
                task = conn.loop.create_task(self._respond_slowly(conn, stream, request.keep_alive))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            elif stream:
                conn.send(self._stream_all)
            else:
                conn.send(self._completion)
            return
        status, body = 200, b'{"status": "ok"}'
        if path == b"/stats" and method == b"GET":
            body = self.stats.to_json()
        elif path == b"/stats/reset" and method == b"POST":
            self.stats = Stats()
            body = self.stats.to_json()
        elif path != b"/healthz":
            status, body = 404, b'{"error": "not found"}'
        head = _head(status, b"application/json", len(body), request.keep_alive)
        conn.send(head + body, close=not request.keep_alive)

    async def _respond_slowly(self, conn: UpstreamProtocol, stream: bool, keep_alive: bool) -> None:
        """The rare path: an artificial delay, paced chunks, or a connection to close."""
        if self.delay:
            await asyncio.sleep(self.delay)
        if not stream:
            body = self.payloads.completion
            conn.send(_head(200, b"application/json", len(body), keep_alive) + body, close=not keep_alive)
        else:
            conn.send(_head(200, b"text/event-stream", None, keep_alive))
            for index, event in enumerate(self.payloads.stream_events):
                if index and self.chunk_interval:
                    await asyncio.sleep(self.chunk_interval)
                conn.send(_chunk(event))
            conn.send(b"0\r\n\r\n", close=not keep_alive)
        conn.finish_response()


async def serve(host: str, port: int, upstream: FakeUpstream) -> None:
    """Listen until SIGINT or SIGTERM."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    server = await loop.create_server(
        lambda: UpstreamProtocol(upstream), host, port, backlog=2048, reuse_address=True
    )
    bound = server.sockets[0].getsockname()
    print(f"fake upstream listening on http://{bound[0]}:{bound[1]}", flush=True)
    async with server:
        await stop.wait()


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run on uvloop when it is installed (it is with the project's dependencies)."""
    runner: Callable[[Coroutine[Any, Any, None]], None] = asyncio.run
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        pass
    runner(main)


def steady_malloc() -> None:
    """Keep large allocations on a heap that is never given back to the kernel (glibc only).

    Request bodies of hundreds of KB cross glibc's mmap threshold, which it moves as it
    sees allocations come and go; depending on that history, each body costs either a few
    page faults or none, and the upstream's throughput at 120k tokens flips between two
    modes (1.8k and 5.5k req/s measured here) for the same load. Fixed thresholds make it
    always the fast mode, so the direct baseline does not depend on what ran before it.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-3, 64 * 1024 * 1024)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 1024 * 1024 * 1024)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass  # not glibc: the allocator has its own behaviour


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18000)
    parser.add_argument("--chunks", type=int, default=8, help="content chunks per streamed reply")
    parser.add_argument("--chunk-interval-ms", type=float, default=0.0, help="pause between SSE events")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="pause before every chat response")
    args = parser.parse_args(argv)
    steady_malloc()
    upstream = FakeUpstream(args.chunks, args.chunk_interval_ms / 1000, args.delay_ms / 1000)
    run(serve(args.host, args.port, upstream))
    return 0


if __name__ == "__main__":
    sys.exit(main())
