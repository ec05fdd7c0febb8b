"""The spans of a served request, made from its ``RequestTrace`` with OpenTelemetry's SDK and
exported over OTLP/HTTP in the background (a batch processor: the request never waits for the
collector, and a collector that is down costs dropped spans, never a failed request).

Imported only when ``tracing.enabled`` is set: the SDK and its exporter are the optional
``otel`` extra. Attributes follow OpenTelemetry's HTTP and GenAI semantic conventions where
they apply (``http.request.method``, ``gen_ai.request.model``, ``gen_ai.usage.input_tokens``),
and ``compaction.*`` for what is the proxy's own.
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from proxy.exchange import Exchange
from proxy.tracing import RequestTrace, SpanRecord, TracingSettings

# The provider each door's API is, as GenAI conventions name it.
_GEN_AI_PROVIDER = {"chat": "openai", "responses": "openai", "anthropic": "anthropic"}
_GEN_AI_OPERATION = {"chat": "chat", "responses": "chat", "anthropic": "chat"}
_KINDS = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT}


class _ChosenIds(IdGenerator):
    """Gives the SDK the identifiers the proxy chose while serving the request (the upstream
    already saw them in ``traceparent``); random ones when none is waiting."""

    def __init__(self) -> None:
        self.random = RandomIdGenerator()
        self.span_id: int | None = None
        self.trace_id: int | None = None

    def generate_span_id(self) -> int:
        chosen, self.span_id = self.span_id, None
        return chosen if chosen is not None else self.random.generate_span_id()

    def generate_trace_id(self) -> int:
        chosen, self.trace_id = self.trace_id, None
        return chosen if chosen is not None else self.random.generate_trace_id()


class SpanExport:
    """An observer: the sealed request's trace, as spans, to the collector."""

    def __init__(self, settings: TracingSettings, processor: SpanProcessor | None = None) -> None:
        self.ids = _ChosenIds()
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": settings.service_name}), id_generator=self.ids
        )
        self.provider.add_span_processor(
            processor
            or BatchSpanProcessor(
                OTLPSpanExporter(endpoint=settings.endpoint, headers=dict(settings.headers), timeout=5),
                schedule_delay_millis=settings.export_delay_ms,
            )
        )
        self.tracer = self.provider.get_tracer("compaction-proxy")

    def observe(self, exchange: Exchange) -> None:
        recorded = exchange.trace
        if recorded is None or not recorded.sampled:
            return
        root = self._request_span(exchange, recorded)
        parent = trace.set_span_in_context(root)
        for phase in recorded.spans:
            self._phase_span(phase, parent)
        # Observers run as soon as the response is out: now is the request's end.
        root.end(end_time=max([time.time_ns(), *(p.end_ns for p in recorded.spans)]))

    def shutdown(self) -> None:
        """Sends what is left (bounded by the exporter's timeout) and stops the exporter."""
        self.provider.shutdown()

    def _request_span(self, exchange: Exchange, recorded: RequestTrace) -> Any:
        context = None
        if recorded.parent_span_id is not None:
            remote = SpanContext(
                recorded.trace_id,
                recorded.parent_span_id,
                is_remote=True,
                trace_flags=TraceFlags(recorded.flags),
            )
            context = trace.set_span_in_context(NonRecordingSpan(remote))
        else:
            self.ids.trace_id = recorded.trace_id
        self.ids.span_id = recorded.span_id
        span = self.tracer.start_span(
            f"{exchange.method} {exchange.route}",
            context=context,
            kind=SpanKind.SERVER,
            start_time=recorded.start_ns,
            attributes=_request_attributes(exchange),
        )
        if exchange.status >= 500 or exchange.error:
            span.set_status(Status(StatusCode.ERROR, exchange.error or str(exchange.status)))
        return span

    def _phase_span(self, phase: SpanRecord, parent: Any) -> None:
        self.ids.span_id = phase.span_id
        span = self.tracer.start_span(
            phase.name,
            context=parent,
            kind=_KINDS.get(phase.kind, SpanKind.INTERNAL),
            start_time=phase.start_ns,
            attributes={k: v for k, v in phase.attributes.items() if v is not None},
        )
        if phase.error:
            span.set_status(Status(StatusCode.ERROR, phase.error))
        span.end(end_time=phase.end_ns or phase.start_ns)


def _request_attributes(exchange: Exchange) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "http.request.method": exchange.method,
        "http.response.status_code": exchange.status,
        "compaction.request_id": exchange.request_id,
        "compaction.route": exchange.route,
    }
    if exchange.route in _GEN_AI_PROVIDER:
        attributes["gen_ai.provider.name"] = _GEN_AI_PROVIDER[exchange.route]
        attributes["gen_ai.operation.name"] = _GEN_AI_OPERATION[exchange.route]
    if isinstance(exchange.model, str):
        attributes["gen_ai.request.model"] = exchange.model[:200]
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
    if exchange.error:
        attributes["error.type"] = exchange.error
    return attributes
