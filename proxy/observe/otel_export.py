"""The spans of served requests, made from their ``RequestTrace`` records as OTLP messages and
posted to the collector over OTLP/HTTP (protobuf) from the event loop, in batches.

Each request's spans are encoded when its response is out (``proxy/observe/otlp_wire.py``, about
0.02 ms), so a batch is those encodings joined and no batch is ever encoded at once on the
event loop. OpenTelemetry's SDK was measured first: its span objects and its exporter's
encoding cost about 0.2 ms of CPU per request, and its export thread held the event loop for
~12 ms at each batch (the p99 of the 30k pass-through benchmark). A request never waits for the
collector: a batch that cannot be sent is dropped, counted and logged, never retried into
unbounded memory.

Attributes follow OpenTelemetry's HTTP and GenAI semantic conventions where they apply
(``http.request.method``, ``gen_ai.request.model``, ``gen_ai.usage.input_tokens``), and
``compaction.*`` for what is the proxy's own. No content, header or key is ever an attribute.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import time
from typing import Any

import httpx

from proxy.config.sections import TracingSettings
from proxy.observe import otlp_wire as wire
from proxy.telemetry.exchange import Exchange
from proxy.telemetry.tracing import RequestTrace, SpanRecord

# The provider each door's API is, as GenAI conventions name it.
_GEN_AI_PROVIDER = {
    "chat": "openai",
    "responses": "openai",
    "anthropic": "anthropic",
    "gemini": "gcp.gemini",
    "gemini_count": "gcp.gemini",
    "code_assist": "gcp.gemini",
}
_KINDS = {"internal": wire.KIND_INTERNAL, "client": wire.KIND_CLIENT}
# Bytes of encoded spans held for the next batch at most; past it a request's spans are
# dropped (and counted).
MAX_PENDING_BYTES = 16 * 1024 * 1024


class SpanExport:
    """An observer: each sampled request's trace, as spans, batched to the collector."""

    def __init__(
        self, settings: TracingSettings, log: Any = None, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.settings = settings
        self.log = log
        # Each request's spans, serialized as a whole export request when it is observed: the
        # protocol's messages merge when concatenated (repeated fields append), so a batch is
        # these joined, and no batch is ever encoded at once on the event loop.
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        self.pending_spans = 0
        self.dropped = 0
        self.exported = 0
        self.client = httpx.AsyncClient(
            transport=transport,
            timeout=httpx.Timeout(5.0),
            headers={"content-type": "application/x-protobuf", **settings.headers},
        )
        try:
            version = importlib.metadata.version("compaction-proxy")
        except importlib.metadata.PackageNotFoundError:
            version = "0"
        self.resource = wire.resource(wire.Attributes(1).encode({"service.name": settings.service_name}))
        self.scope = wire.scope("compaction-proxy", version)
        self.attributes = wire.Attributes(9, unique=("compaction.request_id",))
        self._told_failure = False

    def observe(self, exchange: Exchange) -> None:
        recorded = exchange.trace
        if recorded is None or not recorded.sampled:
            return
        count = len(recorded.spans) + 1
        if self.pending_bytes > MAX_PENDING_BYTES:
            self.dropped += count
            return
        trace_id = recorded.trace_id.to_bytes(16, "big")
        request_id = recorded.span_id.to_bytes(8, "big")
        end = max([time.time_ns(), *(p.end_ns for p in recorded.spans)])
        spans = [self._request_span(exchange, recorded, trace_id, request_id, end)]
        spans.extend(self._phase_span(p, trace_id, request_id) for p in recorded.spans)
        encoded = wire.export_request(self.resource, self.scope, spans)
        self.pending.append(encoded)
        self.pending_bytes += len(encoded)
        self.pending_spans += count

    async def export_forever(self) -> None:
        """Sends what finished, every ``export_delay_ms``."""
        while True:
            await asyncio.sleep(self.settings.export_delay_ms / 1000)
            await self.flush()

    async def flush(self) -> None:
        if not self.pending:
            return
        batch, spans = b"".join(self.pending), self.pending_spans
        self.pending, self.pending_bytes, self.pending_spans = [], 0, 0
        try:
            answer = await self.client.post(self.settings.endpoint, content=batch)
            failure = None if answer.status_code < 300 else f"HTTP {answer.status_code}"
        except httpx.HTTPError as exc:
            failure = type(exc).__name__
        if failure is None:
            self.exported += spans
            self._told_failure = False
            return
        self.dropped += spans
        if self.log is not None and not self._told_failure:
            # Once until a batch goes through again: a collector that is down is one line.
            self.log.warning("trace_export_failed", error=failure, spans_dropped=spans)
        self._told_failure = True

    async def shutdown(self) -> None:
        """Sends what is left (bounded by the client's timeout) and closes the client."""
        await self.flush()
        await self.client.aclose()

    def _request_span(
        self, exchange: Exchange, recorded: RequestTrace, trace_id: bytes, span_id: bytes, end: int
    ) -> bytes:
        failed = exchange.status >= 500 or bool(exchange.error)
        parent = recorded.parent_span_id
        return wire.span(
            trace_id=trace_id,
            span_id=span_id,
            parent_span_id=parent.to_bytes(8, "big") if parent else b"",
            name=f"{exchange.method} {exchange.route}",
            kind=wire.KIND_SERVER,
            start_ns=recorded.start_ns,
            end_ns=end,
            attributes=self.attributes.encode(_request_attributes(exchange)),
            error=(exchange.error or str(exchange.status)) if failed else None,
        )

    def _phase_span(self, phase: SpanRecord, trace_id: bytes, parent: bytes) -> bytes:
        return wire.span(
            trace_id=trace_id,
            span_id=phase.span_id.to_bytes(8, "big"),
            parent_span_id=parent,
            name=phase.name,
            kind=_KINDS.get(phase.kind, wire.KIND_INTERNAL),
            start_ns=phase.start_ns,
            end_ns=phase.end_ns or phase.start_ns,
            attributes=self.attributes.encode(phase.attributes),
            error=phase.error,
        )


def _request_attributes(exchange: Exchange) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "http.request.method": exchange.method,
        "http.response.status_code": exchange.status,
        "compaction.request_id": exchange.request_id,
        "compaction.route": exchange.route,
        "gen_ai.provider.name": _GEN_AI_PROVIDER.get(exchange.route),
        "gen_ai.operation.name": "chat" if exchange.route in _GEN_AI_PROVIDER else None,
        "gen_ai.request.model": exchange.model[:200] if isinstance(exchange.model, str) else None,
        "error.type": exchange.error,
    }
    if exchange.policy != "-":
        attributes["compaction.policy"] = exchange.policy
        attributes["compaction.mode"] = exchange.mode
    if exchange.tokens_before is not None and exchange.tokens_after is not None:
        attributes["compaction.tokens_before"] = exchange.tokens_before
        attributes["compaction.tokens_after"] = exchange.tokens_after
    if exchange.token_count and exchange.token_count.get("reported"):
        attributes["gen_ai.usage.input_tokens"] = exchange.token_count["reported"]
    if exchange.read_rounds:
        attributes["compaction.read_rounds"] = exchange.read_rounds
    return attributes
