"""The one place a response to the client is written, and the one rule for failures.

Every path that answers a client (the direct relay, the ``read_tool_output`` loop, errors the
proxy makes itself) writes through a ``ResponseWriter``. The rule for an upstream failure:

- **before the response has started** (no header sent), the client gets an honest status: the
  upstream's own status and body when it answered with an error, else the proxy's 502/504;
- **after it has started**, the status is gone: a streamed response ends with the dialect's
  error event and *without* its end-of-stream marker (no ``[DONE]``), so an SDK raises instead
  of reporting a complete answer; a non-streamed body is left incomplete.

Headers may be held until the first body byte (``start`` records them, the first ``write``
sends them), so a response that has produced nothing yet can still fail with a real status.
Body writes may be held between ``hold_writes`` and ``release_writes`` and sent as one (what
one upstream chunk relays); the response counts as started at the first held write.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from proxy.wire.errors import ErrorBody, ProxyError, openai_error_body

Send = Callable[[dict[str, Any]], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]
# The dialect's in-stream error event for a failure after the response started.
ErrorEvent = Callable[[ProxyError], bytes]
ClientStream = TypeVar("ClientStream")


class Capture(Protocol):
    """Something that keeps what the client is sent (the canary's answer capture)."""

    def take(self, chunk: bytes) -> None: ...


def chat_error_event(error: ProxyError) -> bytes:
    """Chat Completions: the SDKs raise ``APIError`` on a ``data: {"error": ...}`` event."""
    return b"data: " + error.body() + b"\n\n"


class ResponseWriter:
    def __init__(
        self,
        send: Send,
        *,
        extra_headers: Headers | None = None,
        error_event: ErrorEvent = chat_error_event,
        error_body: ErrorBody = openai_error_body,
        mark_done: Callable[[], None] = lambda: None,
        capture: Capture | None = None,
    ) -> None:
        self._send = send
        self._capture = capture
        self._error_body = error_body
        self.extra_headers = list(extra_headers or [])
        self._error_event = error_event
        self._mark_done = mark_done
        self._pending: tuple[int, Headers] | None = None
        self.started = False  # headers sent
        self.finished = False
        self.streaming = False  # the body is an event stream
        self.status = 0
        self.body_bytes = 0
        # The client-side stream all upstream rounds of one response share (a codec lives one
        # round): made by the first round's codec, found by the next (``client_stream``).
        self._client_stream: object | None = None
        self._held: list[bytes] | None = None  # body writes held to be sent as one

    def client_stream(self, kind: type[ClientStream], make: Callable[[], ClientStream]) -> ClientStream:
        """The response's client-side stream state (ids, numbering), made by ``make`` on the
        first round; every later round of the response gets the same object."""
        if not isinstance(self._client_stream, kind):
            self._client_stream = make()
        return self._client_stream

    def use_error_event(self, error_event: ErrorEvent) -> None:
        """A stream whose error event needs its own state (its ids, its numbering) says so."""
        self._error_event = error_event

    def set_header(self, name: bytes, value: bytes) -> None:
        """Add or replace a header while the response has not started."""
        self.extra_headers = [(k, v) for k, v in self.extra_headers if k != name]
        self.extra_headers.append((name, value))

    def start(self, status: int, headers: Headers, *, streaming: bool = False) -> None:
        """Record the status and headers; they go out with the first body bytes."""
        self._pending = (status, list(headers))
        self.streaming = streaming
        self.status = status

    async def _flush_start(self) -> None:
        if self.started:
            return
        if self._pending is None:
            raise RuntimeError("write before start")
        status, headers = self._pending
        self._pending = None
        self.started = True
        await self._send(
            {"type": "http.response.start", "status": status, "headers": headers + self.extra_headers}
        )

    async def write(self, chunk: bytes) -> None:
        await self._flush_start()
        if chunk:
            self.body_bytes += len(chunk)
            if self._capture is not None:
                self._capture.take(chunk)
            if self._held is not None:
                self._held.append(chunk)
                return
            await self._send({"type": "http.response.body", "body": chunk, "more_body": True})

    def hold_writes(self) -> None:
        """Keep body writes until ``release_writes`` (the headers still go out at once)."""
        if self._held is None:
            self._held = []

    async def release_writes(self) -> None:
        held, self._held = self._held, None
        if held:
            await self._send({"type": "http.response.body", "body": b"".join(held), "more_body": True})

    async def finish(self, last: bytes = b"") -> None:
        """The last body bytes: the response is complete. Writes still held go out with them,
        in one send (a held stream's end is one write, not two)."""
        held, self._held = self._held, None
        await self._flush_start()
        self.body_bytes += len(last)
        if self._capture is not None and last:
            self._capture.take(last)
        self.finished = True
        self._mark_done()
        body = b"".join((*held, last)) if held else last
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def respond(self, status: int, headers: Headers, body: bytes) -> None:
        """A whole response at once (only before anything was sent)."""
        headers = [(k, v) for k, v in headers if k != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        self.start(status, headers)
        await self.finish(body)

    async def fail(self, error: ProxyError) -> None:
        """The single failure rule: an error response if nothing was sent, else the dialect's
        error event (streams) or an incomplete body, and the end of the response."""
        if self.finished:
            return
        if not self.started:
            self._pending = None
            headers = [(b"content-type", b"application/json"), *error.headers]
            await self.respond(error.status, headers, self._error_body(error))
            return
        if self.streaming:
            await self.write(self._error_event(error))
        await self.release_writes()
        self.finished = True
        self._mark_done()
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})
