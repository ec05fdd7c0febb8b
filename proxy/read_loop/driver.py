"""The driver of a ``ReadLoop`` (``loop.py``): it does the I/O of one client request.

One loop runs the loop's commands: ``Send`` a round upstream (a JSON answer or an event stream
comes back, the only difference between the two; a stream is relayed through the dialect's
codec as it arrives) and feed the loop its answer; run a ``Read`` against the store
(``store_reads.py``) and give the loop its results; write the final answer (``Done``) or the
failure (``Fail``). Every response goes through a ``ResponseWriter``: a round that fails before
anything reached the client answers with the upstream's status and body, one that fails after
ends the stream with the dialect's error event and no end-of-stream marker.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from proxy.dialects.base import Answer, StreamCodec
from proxy.read_loop.commands import Command, Done, Fail, Read, Received, Send
from proxy.read_loop.loop import ReadLoop
from proxy.read_loop.store_reads import run_reads
from proxy.state.store import Store
from proxy.telemetry.exchange import LoopResult
from proxy.telemetry.tracing import RequestTrace, upstream_call
from proxy.upstream.pool import Upstream, failure_kind, stream_failure, upstream_failure
from proxy.upstream.relay import Held, Refused
from proxy.upstream.window_words import REFUSAL_STATUSES
from proxy.wire.errors import ProxyError
from proxy.wire.forwarding import client_response_headers
from proxy.wire.json_body import dump_json
from proxy.wire.response_writer import ResponseWriter
from proxy.wire.sse_framer import EventTooLarge, SSEFramer


class ResponseTooLarge(Exception):
    """A JSON answer past the limit: read no further."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"an answer larger than {limit} bytes")


async def read_capped(response: httpx.Response, limit: int) -> bytes:
    """The whole body, or ``ResponseTooLarge`` as soon as it passes ``limit`` bytes."""
    parts: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise ResponseTooLarge(limit)
        parts.append(chunk)
    return b"".join(parts)


def _response_headers(response: httpx.Response) -> list[tuple[bytes, bytes]]:
    return [
        (k, v)
        for k, v in client_response_headers(response.headers.raw)
        if k not in (b"content-length", b"content-encoding")
    ]


def _round_headers(response: httpx.Response, request_id: bytes) -> list[tuple[bytes, bytes]]:
    headers = _response_headers(response)
    if not any(k == b"x-request-id" for k, _ in headers):
        headers.append((b"x-request-id", request_id))
    return headers


def _upstream_error(status: int, raw: bytes) -> ProxyError:
    """A read round the upstream refused, for a client whose response has already started."""
    message = f"The upstream answered HTTP {status} to a read_tool_output round."
    code: str | None = None
    try:
        error = orjson.loads(raw).get("error")
        if isinstance(error, dict):
            message += f" {error.get('message') or ''}".rstrip()
            code = error.get("code") if isinstance(error.get("code"), str) else None
    except (orjson.JSONDecodeError, AttributeError):
        pass
    return ProxyError(
        status if status >= 400 else 502, message, type="upstream_error", code=code or "upstream_error"
    )


@dataclass(frozen=True, slots=True)
class _Round:
    """An upstream answer received: what the loop is fed, and how it reaches the client if it
    is the last (with the usage summed over the rounds)."""

    answer: Answer | Received
    finish: Callable[[dict[str, int]], Awaitable[None]]


class LoopDriver:
    """Runs a ``ReadLoop`` against the upstream for one client request (JSON or a stream), in
    the loop's dialect."""

    def __init__(
        self,
        loop: ReadLoop,
        *,
        upstream: Upstream,
        store: Store,
        url: str,
        headers: list[tuple[bytes, bytes]],
        tenant: str,
        writer: ResponseWriter,
        request_id: str,
        trace: RequestTrace | None = None,
        encode: Callable[[dict[str, Any]], bytes] = dump_json,
        refused: Refused | None = None,
    ) -> None:
        self.loop = loop
        # Shown a refusal before anything reached the client (``upstream/relay.py``'s rule): when
        # it takes the answer over (the route compacts again to the window it named), the answer
        # is ``held`` instead of relayed.
        self.refused = refused
        self.held: Held | None = None
        self.encode = encode
        self.trace = trace
        self.dialect = loop.dialect
        self.upstream = upstream
        self.store = store
        self.url = url
        # The proxy must read these answers, so it asks for them uncompressed.
        self.headers = [(k, v) for k, v in headers if k != b"accept-encoding"] + [
            (b"accept-encoding", b"identity")
        ]
        self.tenant = tenant
        self.writer = writer
        self.request_id = request_id.encode()
        self.streaming = loop.dialect.streams(loop.body)

    @property
    def result(self) -> LoopResult:
        return self.loop.result

    async def run(self) -> LoopResult:
        try:
            await self._drive()
        except (ResponseTooLarge, EventTooLarge) as exc:
            # A hostile or broken upstream: bounded memory, a clean and named error, by the
            # one failure rule (a status before the response started, an error event after).
            self.result.error = "upstream_too_large"
            await self.writer.fail(
                ProxyError(
                    502,
                    f"The upstream sent {exc} during a read_tool_output round.",
                    type="upstream_error",
                    code="upstream_too_large",
                )
            )
        except httpx.HTTPError as exc:
            request_id = self.request_id.decode()
            if self.writer.started:
                self.result.error = _stream_failure(exc)
                await self.writer.fail(stream_failure(exc, request_id=request_id))
            else:
                self.result.error = failure_kind(exc)
                await self.writer.fail(upstream_failure(exc, request_id=request_id))
        return self.result

    async def _drive(self) -> None:
        """The loop's commands, until the response is written."""
        command: Command = self.loop.start()
        last: _Round | None = None
        while True:
            match command:
                case Send():
                    last = await self._round_trip(command)
                    if last is None:
                        return  # answered already: refused, not an answer, or ended by the upstream
                    command = self.loop.feed(last.answer)
                case Read(reads=reads):
                    phase = (
                        self.trace.phase("read_tool_output", {"compaction.reads": len(reads)})
                        if self.trace
                        else None
                    )
                    command = self.loop.resolved(await run_reads(reads, self.loop, self.store, self.tenant))
                    if phase is not None:
                        phase.end()
                case Done(usage=usage):
                    assert last is not None
                    await last.finish(usage)
                    return
                case Fail(error=error):
                    await self.writer.fail(error)
                    return

    async def _round_trip(self, send: Send) -> _Round | None:
        """One round: its body upstream, its answer back (None: the response is written)."""
        self.writer.set_header(b"x-compaction-tokens-after", str(send.tokens_after).encode())
        self.writer.set_header(b"x-compaction-read-rounds", str(send.read_rounds).encode())
        call = upstream_call(self.trace, self.url, round=send.read_rounds)
        headers = self.trace.upstream_headers(self.headers, call) if self.trace and call else self.headers
        started = time.perf_counter()
        try:
            response = await self.upstream.open("POST", self.url, headers, self.encode(send.body))
        except httpx.HTTPError as exc:
            if call is not None:
                call.error = type(exc).__name__
                call.end()
            raise
        finally:
            self.result.upstream_seconds += time.perf_counter() - started
        started = time.perf_counter()
        try:
            if response.status_code != 200:
                await self._refused(response)
                return None
            received = await self._receive(response)
        finally:
            await response.aclose()
            self.result.upstream_seconds += time.perf_counter() - started
            if call is not None:
                call.end(**{"http.response.status_code": response.status_code})
        if isinstance(received, bytes):
            return await self._json_answer(response, received)
        return await self._streamed_answer(received)

    async def _receive(self, response: httpx.Response) -> bytes | StreamCodec:
        """The answer's body (JSON), or its stream relayed through the dialect's codec."""
        if not self.streaming:
            return await read_capped(response, self.loop.limits.max_response_bytes)
        self.result.status = 200
        if not self.writer.started:
            self.writer.start(200, _round_headers(response, self.request_id), streaming=True)
        stream = self.dialect.codec(self.writer)
        framer = SSEFramer(self.loop.limits.max_event_bytes)
        async for chunk in response.stream:  # type: ignore[union-attr]
            # What one upstream chunk relays goes out in one write: 100,000 tiny deltas
            # cost a few hundred sends, not 100,000.
            self.writer.hold_writes()
            try:
                await stream.take_all(framer.feed(chunk))
            finally:
                await self.writer.release_writes()
        rest = framer.rest()
        if rest.strip():
            await stream.take(rest)
        return stream

    async def _json_answer(self, response: httpx.Response, raw: bytes) -> _Round | None:
        self.result.status = 200
        try:
            data: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            data = None
        answer = self.dialect.json_answer(data)
        headers = _round_headers(response, self.request_id)
        if answer is None:
            await self.writer.respond(200, headers, raw)  # not an answer: relayed as it came
            return None

        async def finish(total: dict[str, int]) -> None:
            await self.writer.respond(200, headers, self.dialect.final_json(data, total))

        return _Round(answer, finish)

    async def _streamed_answer(self, stream: StreamCodec) -> _Round | None:
        if stream.error is not None:
            # The upstream itself ended its stream with an error event: relayed as such.
            self.result.error = "upstream_error"
            await self.writer.finish()
            return None
        calls, items = stream.calls(), stream.items()

        def whole() -> Answer:
            return Answer(calls=calls, text=stream.text or None, usage=stream.usage, items=items)

        return _Round(Received(calls, stream.usage, items, whole, stream.complete), stream.finish)

    async def _refused(self, response: httpx.Response) -> None:
        """A round answered with an error status: relayed if nothing was sent yet."""
        raw = await read_capped(response, self.loop.limits.max_response_bytes)
        self.result.status = response.status_code
        status, refused = response.status_code, self.refused
        taken = not self.writer.started and refused is not None and status in REFUSAL_STATUSES
        if taken and refused is not None and refused(status, raw):
            self.held = Held(status, list(response.headers.raw), raw)
            return
        if not self.writer.started:
            await self.writer.respond(response.status_code, _round_headers(response, self.request_id), raw)
            return
        self.result.error = "upstream_error"
        await self.writer.fail(_upstream_error(response.status_code, raw))


def _stream_failure(exc: httpx.HTTPError) -> str:
    return "upstream_timeout" if isinstance(exc, httpx.TimeoutException) else "upstream_reset"
