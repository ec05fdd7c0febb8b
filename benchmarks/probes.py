"""Sequential probes that wrk cannot do: time to the first streamed ``data:`` line, and a
growing agent session sent request by request over one keep-alive connection.

The client is a minimal HTTP/1.1 implementation on a raw socket on purpose: it adds the
same few microseconds to the direct and the proxied request, it sees the moment the first
SSE event arrives (an HTTP library would buffer), and it never consults proxy environment
variables, so every byte goes to 127.0.0.1 as asked.
"""

from __future__ import annotations

import socket
import statistics
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Endpoint:
    """Where a target's chat completions live, plus headers sent only to it."""

    name: str
    host: str
    port: int
    path: str
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{self.path}"


def chat_endpoint(name: str, url: str, headers: dict[str, str] | None = None) -> Endpoint:
    """Accept a root URL, an OpenAI base URL (``.../v1``) or the full chat completions URL.

    Only loopback targets are accepted: the benchmark must never send traffic elsewhere.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in ("127.0.0.1", "localhost"):
        raise ValueError(f"{name}: only http://127.0.0.1 targets are benchmarked, not {url!r}")
    path = parts.path.rstrip("/")
    if not path.endswith("/chat/completions"):
        path += "/chat/completions" if path.endswith("/v1") else "/v1/chat/completions"
    return Endpoint(name, "127.0.0.1", parts.port or 80, path, dict(headers or {}))


@dataclass
class Timing:
    """One request, in seconds from just before the request was written."""

    status: int
    head: float
    first_data: float | None
    total: float
    body: bytes = b""


class HttpConnection:
    """One keep-alive HTTP/1.1 connection; requests are sent one at a time."""

    def __init__(self, endpoint: Endpoint, timeout: float = 60.0) -> None:
        self.endpoint = endpoint
        self.sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = bytearray()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> HttpConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fill(self) -> None:
        data = self.sock.recv(1 << 18)
        if not data:
            raise ConnectionError(f"{self.endpoint.name}: connection closed mid-response")
        self.buffer += data

    def _read_until(self, marker: bytes) -> bytes:
        while (end := self.buffer.find(marker)) < 0:
            self._fill()
        line = bytes(self.buffer[:end])
        del self.buffer[: end + len(marker)]
        return line

    def _read_exact(self, size: int) -> bytes:
        while len(self.buffer) < size:
            self._fill()
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    def post(self, body: bytes, extra_headers: dict[str, str] | None = None) -> Timing:
        """POST ``body`` to the endpoint and read the whole response."""
        headers = {
            "Host": f"{self.endpoint.host}:{self.endpoint.port}",
            "Content-Type": "application/json",
            "Content-Length": str(len(body)),
            **self.endpoint.headers,
            **(extra_headers or {}),
        }
        head = f"POST {self.endpoint.path} HTTP/1.1\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        started = time.perf_counter()
        self.sock.sendall(head.encode("latin-1") + body)
        response_head = self._read_until(b"\r\n\r\n").decode("latin-1").split("\r\n")
        head_at = time.perf_counter()
        status = int(response_head[0].split(" ", 2)[1])
        fields = {}
        for line in response_head[1:]:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip().lower()
        first_data: list[float] = []
        parts: list[bytes] = []

        def on_data(data: bytes) -> None:
            if not first_data and b"data:" in (parts[-1][-5:] if parts else b"") + data:
                first_data.append(time.perf_counter())
            parts.append(data)

        if "chunked" in fields.get("transfer-encoding", ""):
            while size := int(self._read_until(b"\r\n").split(b";", 1)[0], 16):
                on_data(self._read_exact(size))
                self._read_exact(2)
            while self._read_until(b"\r\n"):  # trailers, then the blank line
                pass
        elif "content-length" in fields:
            on_data(self._read_exact(int(fields["content-length"])))
        else:
            raise ConnectionError(f"{self.endpoint.name}: response has no length (close-delimited)")
        ended = time.perf_counter()
        if fields.get("connection") == "close":
            raise ConnectionError(f"{self.endpoint.name}: server closed the keep-alive connection")
        first = first_data[0] - started if first_data else None
        return Timing(status, head_at - started, first, ended - started, b"".join(parts))


def _median_ms(values: Sequence[float | None]) -> float | None:
    present = [v * 1000 for v in values if v is not None]
    return statistics.median(present) if present else None


def ttfb_probe(
    direct: Endpoint, proxy: Endpoint, body: bytes, count: int, budget_s: float = 120.0
) -> dict[str, Any]:
    """``count`` sequential streaming requests to each target, interleaved request by request
    (so drift hits both alike), each target on its own keep-alive connection.

    Reports the medians of time to response head, to the first ``data:`` byte and to the end
    of the stream, and the proxy's added time to first data (median of paired differences).
    """
    timings: dict[str, list[Timing]] = {"direct": [], "proxy": []}
    deadline = time.monotonic() + budget_s
    with HttpConnection(direct) as to_direct, HttpConnection(proxy) as to_proxy:
        for index in range(count):
            if time.monotonic() > deadline:
                break
            pair = [("direct", to_direct), ("proxy", to_proxy)]
            for name, conn in pair if index % 2 == 0 else pair[::-1]:
                timing = conn.post(body)
                if timing.status != 200:
                    raise RuntimeError(f"{conn.endpoint.name}: HTTP {timing.status} on a streaming request")
                timings[name].append(timing)
    result: dict[str, Any] = {"requests": len(timings["proxy"])}
    for name, runs in timings.items():
        result[name] = {
            "head_ms": _median_ms([t.head for t in runs]),
            "first_data_ms": _median_ms([t.first_data for t in runs]),
            "end_ms": _median_ms([t.total for t in runs]),
        }
    pairs = zip(timings["direct"], timings["proxy"], strict=False)
    added = [p.first_data - d.first_data for d, p in pairs if d.first_data and p.first_data]
    result["added_first_data_ms"] = _median_ms(added)
    return result


@dataclass
class SessionSample:
    """One request of a session: its size and its latency direct and through the proxy."""

    index: int
    tokens: int
    direct_ms: float
    proxy_ms: float

    @property
    def added_ms(self) -> float:
        return self.proxy_ms - self.direct_ms


def session_run(
    direct: Endpoint,
    proxy: Endpoint,
    session: Sequence[tuple[int, bytes]],
    budget_s: float = 600.0,
    progress: Callable[[SessionSample], None] | None = None,
) -> list[SessionSample]:
    """Send a growing session in order, each body direct then via the proxy, each target on
    one keep-alive connection, like an agent talking to its API. Bounded by the number of
    bodies and by ``budget_s``."""
    samples: list[SessionSample] = []
    deadline = time.monotonic() + budget_s
    with HttpConnection(direct) as to_direct, HttpConnection(proxy) as to_proxy:
        for index, (tokens, body) in enumerate(session):
            if time.monotonic() > deadline:
                break
            timings = [to_direct.post(body), to_proxy.post(body)]
            for conn, timing in zip((to_direct, to_proxy), timings, strict=True):
                if timing.status != 200:
                    raise RuntimeError(f"{conn.endpoint.name}: HTTP {timing.status} at session step {index}")
            sample = SessionSample(index, tokens, timings[0].total * 1000, timings[1].total * 1000)
            samples.append(sample)
            if progress is not None:
                progress(sample)
    return samples
