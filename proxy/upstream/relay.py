"""Sending a request upstream and relaying the answer byte for byte: the passthrough routes, and
the compacted requests whose view names no saved output."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from proxy.telemetry.exchange import Exchange
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.tracing import upstream_call
from proxy.upstream.pool import Upstream, failure_kind, stream_failure, upstream_failure
from proxy.upstream.window_words import MAX_REFUSAL_BYTES, REFUSAL_STATUSES
from proxy.wire.errors import ErrorBody, openai_error_body
from proxy.wire.forwarding import client_response_headers, header_value
from proxy.wire.response_writer import ErrorEvent, ResponseWriter, chat_error_event

Send = Callable[[dict[str, Any]], Awaitable[None]]
Refused = Callable[[int, bytes], bool]
_SSE = b"text/event-stream"
# Bytes of a real answer kept for a shadow comparison.
CAPTURE_LIMIT = 16 * 1024 * 1024


async def relay(
    *,
    upstream: Upstream,
    metrics: Metrics,
    send: Send,
    method: str,
    url: str,
    headers: list[tuple[bytes, bytes]],
    content: bytes,
    exchange: Exchange,
    route_headers: list[tuple[bytes, bytes]] | None,
    error_event: ErrorEvent = chat_error_event,
    error_body: ErrorBody = openai_error_body,
    refused: Refused | None = None,
) -> Held | None:
    """``route_headers``: the compaction headers of a dialect route (None: passthrough).

    ``refused(status, body)`` is shown a small error answer the upstream gave (a status a
    context refusal comes with, not a stream) before the client sees anything; when it returns
    True it takes the answer over (the route sends the request again, or relays the answer
    with ``relay_held``) and nothing is written: the answer is then returned."""
    call = upstream_call(exchange.trace, url)
    if call is not None and exchange.trace is not None:
        headers = exchange.trace.upstream_headers(headers, call)
        call.attributes["http.request.method"] = method
    sent_at = time.perf_counter()
    try:
        response = await upstream.open(method, url, headers, content)
    except httpx.HTTPError as exc:
        exchange.upstream_seconds = time.perf_counter() - sent_at
        exchange.error = failure_kind(exc)
        if call is not None:
            call.error = exchange.error
            call.end()
        raise upstream_failure(exc, request_id=exchange.request_id) from None
    del content  # sent: not kept while the answer streams
    writer = ResponseWriter(
        send,
        extra_headers=exchange.extra_headers,
        error_event=error_event,
        error_body=error_body,
        mark_done=exchange.mark_responded,
        capture=exchange.canary_capture,
    )
    stream = response.stream
    chunks = aiter(stream)  # type: ignore[arg-type]
    try:
        try:
            held, whole = b"", False
            if refused is not None and response.status_code in REFUSAL_STATUSES and not _is_sse(response):
                held, whole = await _hold(chunks)
                if whole and refused(response.status_code, held):
                    return Held(response.status_code, list(response.headers.raw), held)
            _start(writer, response, exchange, route_headers)
            await writer.write(held)  # headers now: a stream's first event may take the model a while
            last = b"" if whole else await _relay_chunks(chunks, stream, writer, exchange, metrics)
        except httpx.HTTPError as exc:
            error = stream_failure(exc, request_id=exchange.request_id)
            exchange.error = error.code
            metrics.errors.labels(exchange.error).inc()
            await writer.fail(error)
            return None
        await writer.finish(last)
        return None
    finally:
        exchange.upstream_seconds = time.perf_counter() - sent_at
        await response.aclose()
        if call is not None:
            call.error = exchange.error
            call.end(**{"http.response.status_code": response.status_code})


@dataclass(frozen=True, slots=True)
class Held:
    """An upstream's answer held back from the client (a refusal the route may act on)."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


async def relay_held(
    held: Held,
    *,
    send: Send,
    exchange: Exchange,
    route_headers: list[tuple[bytes, bytes]],
    error_event: ErrorEvent = chat_error_event,
    error_body: ErrorBody = openai_error_body,
) -> None:
    """A held answer to the client, as the upstream gave it (with the route's headers)."""
    writer = ResponseWriter(
        send,
        extra_headers=exchange.extra_headers,
        error_event=error_event,
        error_body=error_body,
        mark_done=exchange.mark_responded,
        capture=exchange.canary_capture,
    )
    out_headers = client_response_headers(held.headers)
    if header_value(out_headers, b"x-request-id") is None:
        out_headers.append((b"x-request-id", exchange.request_id.encode()))
    out_headers.extend(route_headers)
    exchange.status = held.status
    writer.start(held.status, out_headers, streaming=False)
    await writer.finish(held.body)


async def _relay_chunks(
    chunks: AsyncIterator[bytes], stream: object, writer: ResponseWriter, exchange: Exchange, metrics: Metrics
) -> bytes:
    """Each chunk to the client as it comes; the last one is returned, not written, when the
    stream says it is drained (the response then ends in one send)."""
    compare = exchange.compare
    head_limit = exchange.head_limit if exchange.status == 200 else 0
    first = True
    async for chunk in chunks:
        if first and exchange.stream:
            metrics.ttfb_seconds.labels(exchange.policy).observe(time.perf_counter() - exchange.started)
            first = False
        if compare is not None and len(compare.captured) < CAPTURE_LIMIT:
            compare.captured += chunk
        if len(exchange.answer_head) < head_limit:
            exchange.answer_head += chunk[: head_limit - len(exchange.answer_head)]
        if getattr(stream, "drained", False):
            # The answer is all in: its last bytes end the response in one send.
            return chunk
        await writer.write(chunk)
    return b""


async def _hold(chunks: AsyncIterator[bytes]) -> tuple[bytes, bool]:
    """The head of an error answer, up to what a refusal can be; True when it is all of it
    (a longer answer goes on streaming from where this stopped)."""
    held = bytearray()
    async for chunk in chunks:
        held += chunk
        if len(held) > MAX_REFUSAL_BYTES:
            return bytes(held), False
    return bytes(held), True


def _is_sse(response: httpx.Response) -> bool:
    return _SSE in response.headers.get("content-type", "").encode("latin-1")


def _start(
    writer: ResponseWriter,
    response: httpx.Response,
    exchange: Exchange,
    route_headers: list[tuple[bytes, bytes]] | None,
) -> None:
    """The client response's status and headers: the upstream's, with the route's own."""
    out_headers = client_response_headers(response.headers.raw)
    if route_headers is not None:
        if header_value(out_headers, b"x-request-id") is None:
            out_headers.append((b"x-request-id", exchange.request_id.encode()))
        out_headers.extend(route_headers)
    exchange.status = response.status_code
    is_sse = _SSE in (response.headers.get("content-type", "").encode("latin-1"))
    if exchange.compare is not None:
        exchange.compare.captured_sse = is_sse
    exchange.answer_sse = is_sse
    writer.start(response.status_code, out_headers, streaming=is_sse)
