"""The trace of a request without the SDK (proxy/tracing.py): W3C traceparent read and written,
the client's sampling decision followed, the upstream's headers given this call's context; and
its spans (proxy/otel_export.py) made with the identifiers the upstream already saw."""

from __future__ import annotations

import random
import time

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from proxy import preflight
from proxy.exchange import Exchange
from proxy.otel_export import SpanExport
from proxy.preflight import PreflightError, check_tracing
from proxy.settings import load_settings
from proxy.tracing import (
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


def exported(recorded: RequestTrace, **facts: object) -> list:  # type: ignore[type-arg]
    memory = InMemorySpanExporter()
    export = SpanExport(TracingSettings(enabled=True), processor=SimpleSpanProcessor(memory))
    exchange = Exchange(request_id="cpx-1", route="chat", method="POST", started=time.perf_counter())
    for name, value in facts.items():
        setattr(exchange, name, value)
    exchange.trace = recorded
    exchange.seal()
    export.observe(exchange)
    export.shutdown()
    return list(memory.get_finished_spans())


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
    assert request.kind == SpanKind.SERVER and request.context.span_id == 0x1111
    assert request.context.trace_id == TRACE and request.parent is not None and request.parent.span_id == SPAN
    assert request.status.status_code == StatusCode.ERROR
    assert request.attributes["gen_ai.request.model"] == "gpt-4o"
    assert request.attributes["error.type"] == "upstream_timeout"
    upstream = by_name["POST upstream"]
    assert upstream.kind == SpanKind.CLIENT and upstream.context.span_id == call.span_id
    assert upstream.parent is not None and upstream.parent.span_id == 0x1111
    assert upstream.status.status_code == StatusCode.ERROR
    assert by_name["parse"].context.span_id == parse.span_id


def test_an_unsampled_trace_exports_nothing() -> None:
    assert exported(RequestTrace(TRACE, 0x1111, SPAN, 0, time.time_ns())) == []


def test_tracing_on_without_the_sdk_is_one_line_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = load_settings(env={}, overrides={"tracing": {"enabled": True}})
    monkeypatch.setattr(preflight.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(PreflightError, match=r"pip install 'compaction-proxy\[otel\]'"):
        check_tracing(settings)
    check_tracing(load_settings(env={}))  # off: nothing is needed
