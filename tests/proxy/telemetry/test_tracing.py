"""The trace of a request without the SDK (proxy/telemetry/tracing.py): W3C traceparent read and written,
the client's sampling decision followed, the upstream's headers given this call's context; and
its spans (proxy/observe/otel_export.py) made with the identifiers the upstream already saw."""

from __future__ import annotations

import asyncio
import random
import time

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from proxy.observe import otlp_wire as wire
from proxy.observe.otel_export import SpanExport
from proxy.telemetry.exchange import Exchange
from proxy.telemetry.tracing import (
    RequestTrace,
    Tracer,
    TracingSettings,
    format_traceparent,
    parse_traceparent,
    upstream_call,
)

TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
SPAN = 0x00F067AA0BA902B7


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", (TRACE, SPAN, 1)),
        (b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-00", (TRACE, SPAN, 0)),
        # A later version's extra fields are ignored; its first four are read the same way.
        (b"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-ever", (TRACE, SPAN, 1)),
        (b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None),  # a forbidden version
        (b"00-00000000000000000000000000000000-00f067aa0ba902b7-01", None),  # zero trace id
        (b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", None),  # zero span id
        (b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902-01", None),
        (b"garbage", None),
        (b"", None),
        (None, None),
    ],
)
def test_traceparent_is_read_as_the_standard_says(value: bytes | None, expected: object) -> None:
    assert parse_traceparent(value) == expected


def test_traceparent_is_written_in_lowercase_hex() -> None:
    assert format_traceparent(TRACE, SPAN, 1) == b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_the_clients_trace_and_sampling_decision_are_followed() -> None:
    tracer = Tracer(TracingSettings(enabled=True, sample_ratio=0.0))
    header = format_traceparent(TRACE, SPAN, 1)
    joined = tracer.begin([(b"traceparent", header), (b"tracestate", b"vendor=1")])
    assert (joined.trace_id, joined.parent_span_id, joined.sampled) == (TRACE, SPAN, True)
    unsampled = tracer.begin([(b"traceparent", format_traceparent(TRACE, SPAN, 0))])
    assert not unsampled.sampled
    # No traceparent: a new trace, sampled at the ratio.
    own = tracer.begin([])
    assert own.parent_span_id is None and not own.sampled and own.trace_id != TRACE
    always = Tracer(TracingSettings(enabled=True, sample_ratio=1.0), rng=random.Random(1)).begin([])
    assert always.sampled


def test_the_upstream_gets_this_calls_context_in_place_of_the_clients() -> None:
    trace = Tracer(TracingSettings(enabled=True)).begin(
        [(b"traceparent", format_traceparent(TRACE, SPAN, 1)), (b"tracestate", b"vendor=1")]
    )
    call = upstream_call(trace, "https://api.example.test:8443/v1/chat/completions", round=0)
    assert call is not None and upstream_call(None, "http://x") is None
    headers = trace.upstream_headers(
        [(b"authorization", b"Bearer k"), (b"traceparent", b"00-old"), (b"tracestate", b"old=1")], call
    )
    assert headers == [
        (b"authorization", b"Bearer k"),
        (b"traceparent", format_traceparent(TRACE, call.span_id, 1)),
        (b"tracestate", b"vendor=1"),
    ]
    assert call.attributes == {
        "http.request.method": "POST",
        "server.address": "api.example.test",
        "server.port": 8443,
        "url.path": "/v1/chat/completions",
        "compaction.round": 0,
    }


def exported(recorded: RequestTrace, **facts: object) -> list[Span]:
    """The spans of one request as the collector receives them (decoded from the posted batch)."""
    posted: list[bytes] = []

    def collector(request: httpx.Request) -> httpx.Response:
        assert request.headers["content-type"] == "application/x-protobuf"
        posted.append(request.content)
        return httpx.Response(200)

    export = SpanExport(TracingSettings(enabled=True), transport=httpx.MockTransport(collector))
    exchange = Exchange(request_id="cpx-1", route="chat", method="POST", started=time.perf_counter())
    for name, value in facts.items():
        setattr(exchange, name, value)
    exchange.trace = recorded
    exchange.seal()
    export.observe(exchange)
    asyncio.run(export.shutdown())
    spans: list[Span] = []
    for body in posted:
        for resource in ExportTraceServiceRequest.FromString(body).resource_spans:
            for scope in resource.scope_spans:
                spans.extend(scope.spans)
    return spans


def attributes(span: Span) -> dict[str, object]:
    return {a.key: getattr(a.value, a.value.WhichOneof("value") or "string_value") for a in span.attributes}


def test_spans_carry_the_identifiers_the_upstream_saw() -> None:
    recorded = RequestTrace(TRACE, 0x1111, SPAN, 1, time.time_ns())
    parse = recorded.phase("parse")
    parse.end()
    call = recorded.phase("POST upstream", {"compaction.round": 0}, kind="client")
    call.error = "upstream_timeout"
    call.end()
    spans = exported(
        recorded, status=504, error="upstream_timeout", model="gpt-4o", policy="improved", mode="enforce"
    )
    by_name = {s.name: s for s in spans}
    request = by_name["POST chat"]
    assert request.kind == Span.SPAN_KIND_SERVER and request.span_id == (0x1111).to_bytes(8, "big")
    assert request.trace_id == TRACE.to_bytes(16, "big") and request.parent_span_id == SPAN.to_bytes(8, "big")
    assert request.status.code == Status.STATUS_CODE_ERROR
    assert attributes(request)["gen_ai.request.model"] == "gpt-4o"
    assert attributes(request)["error.type"] == "upstream_timeout"
    upstream = by_name["POST upstream"]
    assert upstream.kind == Span.SPAN_KIND_CLIENT and upstream.span_id == call.span_id.to_bytes(8, "big")
    assert upstream.parent_span_id == request.span_id and upstream.status.code == Status.STATUS_CODE_ERROR
    assert by_name["parse"].span_id == parse.span_id.to_bytes(8, "big")
    assert request.start_time_unix_nano <= upstream.start_time_unix_nano <= upstream.end_time_unix_nano
    assert upstream.end_time_unix_nano <= request.end_time_unix_nano


def test_an_unsampled_trace_exports_nothing() -> None:
    assert exported(RequestTrace(TRACE, 0x1111, SPAN, 0, time.time_ns())) == []


def test_a_collector_that_is_down_costs_dropped_spans_and_one_line() -> None:
    told: list[tuple[str, dict[str, object]]] = []

    class Log:
        def warning(self, event: str, **fields: object) -> None:
            told.append((event, fields))

    def down(_request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    export = SpanExport(TracingSettings(enabled=True), log=Log(), transport=httpx.MockTransport(down))

    async def two_batches() -> None:
        for _ in range(2):
            exchange = Exchange(request_id="r", route="chat", method="POST", started=time.perf_counter())
            exchange.trace = RequestTrace(TRACE, 0x1111, None, 1, time.time_ns())
            export.observe(exchange)
            await export.flush()
        await export.shutdown()

    asyncio.run(two_batches())
    assert export.dropped == 2 and export.exported == 0 and export.pending == []
    assert told == [("trace_export_failed", {"error": "ConnectError", "spans_dropped": 1})]


@pytest.mark.parametrize(
    "value",
    [
        "POST",
        "",
        "naïve ✓ 日本",
        True,
        False,
        0,
        1,
        127,
        128,
        300,
        2**40,
        -1,
        -(2**63),
        2**63 - 1,
        0.5,
        -3.25,
    ],
)
def test_every_attribute_value_decodes_with_the_protocols_own_classes(value: object) -> None:
    encoded = wire.Attributes(1).encode({"key.name": value})
    decoded = Resource.FromString(encoded).attributes
    assert len(decoded) == 1 and decoded[0].key == "key.name"
    kind = decoded[0].value.WhichOneof("value")
    expected = {bool: "bool_value", int: "int_value", float: "double_value", str: "string_value"}[type(value)]
    assert kind == expected and getattr(decoded[0].value, kind) == value


def test_a_span_and_concatenated_requests_decode_as_one_export() -> None:
    attributes = wire.Attributes(9, unique=("id",))
    spans = [
        wire.span(
            trace_id=TRACE.to_bytes(16, "big"),
            span_id=(n + 1).to_bytes(8, "big"),
            parent_span_id=b"" if n == 0 else (1).to_bytes(8, "big"),
            name=f"span {n}",
            kind=wire.KIND_SERVER if n == 0 else wire.KIND_CLIENT,
            start_ns=1_700_000_000_000_000_000 + n,
            end_ns=1_700_000_000_000_000_999,
            attributes=attributes.encode({"id": f"r{n}", "status": 200, "skip": None}),
            error="boom" if n == 1 else None,
        )
        for n in range(2)
    ]
    resource = wire.resource(wire.Attributes(1).encode({"service.name": "svc"}))
    scope = wire.scope("compaction-proxy", "1.2.3")
    batch = wire.export_request(resource, scope, spans[:1]) + wire.export_request(resource, scope, spans[1:])
    decoded = ExportTraceServiceRequest.FromString(batch)
    assert len(decoded.resource_spans) == 2
    got = [s for r in decoded.resource_spans for ss in r.scope_spans for s in ss.spans]
    assert [s.name for s in got] == ["span 0", "span 1"]
    assert got[0].parent_span_id == b"" and got[1].parent_span_id == (1).to_bytes(8, "big")
    assert got[0].kind == Span.SPAN_KIND_SERVER and got[1].kind == Span.SPAN_KIND_CLIENT
    assert got[1].status.code == Status.STATUS_CODE_ERROR and got[1].status.message == "boom"
    assert got[0].start_time_unix_nano == 1_700_000_000_000_000_000
    assert {a.key: a.value.string_value or a.value.int_value for a in got[1].attributes} == {
        "id": "r1",
        "status": 200,
    }
    first = decoded.resource_spans[0]
    assert first.resource.attributes[0].value.string_value == "svc"
    assert (
        first.scope_spans[0].scope.name == "compaction-proxy"
        and first.scope_spans[0].scope.version == "1.2.3"
    )
