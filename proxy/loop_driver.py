"""The driver of a ``ReadLoop`` (``read_loop.py``): it moves the bytes for one client request.

Each round's body goes upstream; a JSON answer or an event stream (through the dialect's codec)
comes back; reads are resolved against the store and the loop asks again, until an answer the
client gets. Every response goes through a ``ResponseWriter``: a round that fails before anything
reached the client answers with the upstream's status and body, one that fails after ends the
stream with the dialect's error event and no end-of-stream marker.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson

from proxy.dialects.base import Answer
from proxy.errors import ProxyError
from proxy.forwarding import client_response_headers
from proxy.read_answers import resolve_reads
from proxy.read_loop import LoopResult, ReadLoop
from proxy.response_writer import ResponseWriter
from proxy.sse_framer import EventTooLarge, SSEFramer
from proxy.store import Store
from proxy.upstream import Upstream, failure_kind, stream_failure, upstream_failure


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
    ) -> None:
        self.loop = loop
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

    @property
    def result(self) -> LoopResult:
        return self.loop.result

    async def run(self) -> LoopResult:
        try:
            if self.loop.body.get("stream") is True:
                await self._run_stream()
            else:
                await self._run_json()
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

    async def _open(self) -> httpx.Response:
        body = self.loop.next_request()
        self.writer.set_header(b"x-compaction-tokens-after", str(self.result.largest_request).encode())
        self.writer.set_header(b"x-compaction-read-rounds", str(self.result.rounds).encode())
        started = time.perf_counter()
        try:
            return await self.upstream.open("POST", self.url, self.headers, orjson.dumps(body))
        finally:
            self.result.upstream_seconds += time.perf_counter() - started

    async def _refused(self, response: httpx.Response) -> None:
        """A round answered with an error status: relayed if nothing was sent yet."""
        raw = await read_capped(response, self.loop.limits.max_response_bytes)
        self.result.status = response.status_code
        if not self.writer.started:
            await self.writer.respond(response.status_code, _round_headers(response, self.request_id), raw)
            return
        self.result.error = "upstream_error"
        await self.writer.fail(_upstream_error(response.status_code, raw))

    async def _run_json(self) -> None:
        total: dict[str, int] = {}
        while True:
            response = await self._open()
            started = time.perf_counter()
            try:
                if response.status_code != 200:
                    await self._refused(response)
                    return
                raw = await read_capped(response, self.loop.limits.max_response_bytes)
            finally:
                await response.aclose()
                self.result.upstream_seconds += time.perf_counter() - started
            self.result.status = 200
            try:
                data: Any = orjson.loads(raw)
            except orjson.JSONDecodeError:
                data = None
            answer = self.dialect.json_answer(data)
            if answer is None:
                await self.writer.respond(200, _round_headers(response, self.request_id), raw)
                return
            self.dialect.add_usage(total, answer.usage)
            self.result.usage_per_round.append(answer.usage or {})
            reads = self.loop.wants_reads(answer.calls)
            if reads:
                await resolve_reads(self.loop, self.store, self.tenant, reads, answer)
                continue
            self.result.final_answer = list(answer.items)
            await self.writer.respond(
                200, _round_headers(response, self.request_id), self.dialect.final_json(data, total)
            )
            return

    async def _run_stream(self) -> None:
        total: dict[str, int] = {}
        while True:
            response = await self._open()
            started = time.perf_counter()
            try:
                if response.status_code != 200:
                    await self._refused(response)
                    return
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
            finally:
                await response.aclose()
                self.result.upstream_seconds += time.perf_counter() - started
            if stream.error is not None:
                # The upstream itself ended its stream with an error event: relayed as such.
                self.result.error = "upstream_error"
                await self.writer.finish()
                return
            self.dialect.add_usage(total, stream.usage)
            self.result.usage_per_round.append(stream.usage or {})
            reads = self.loop.wants_reads(stream.calls())
            if reads:
                answer = Answer(
                    calls=stream.calls(), text=stream.text or None, usage=stream.usage, items=stream.items()
                )
                await resolve_reads(self.loop, self.store, self.tenant, reads, answer)
                continue
            if not stream.complete:
                # The upstream closed its stream without finishing the answer.
                self.result.error = "upstream_reset"
                await self.writer.fail(
                    ProxyError(
                        502,
                        "The upstream stream ended before the answer was complete.",
                        type="upstream_error",
                        code="upstream_reset",
                    )
                )
                return
            self.result.final_answer = stream.items()
            await stream.finish(total)
            return


def _stream_failure(exc: httpx.HTTPError) -> str:
    return "upstream_timeout" if isinstance(exc, httpx.TimeoutException) else "upstream_reset"
