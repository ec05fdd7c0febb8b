"""OpenTelemetry traces of the proxy's requests, recorded on the hot path without the SDK.

While a request is served, its trace is a few integers and timestamps on the ``Exchange``
(``RequestTrace``): the span of the request, one child span per phase (reading the body,
compacting it, each call upstream, each answer's reads of saved outputs). The identifiers are
chosen when a phase starts, so the ``traceparent`` sent upstream already names the span of that
call, and the upstream's own spans join the client's trace. Once the response is out, the
``SpanExport`` observer (``proxy/observe/otel_export.py``, loaded only when tracing is on) turns the
record into OTLP spans and exports them over OTLP/HTTP. With tracing off no trace
is made: the client's own ``traceparent`` goes upstream as sent, as every header does.

Spans carry the request's shape (route, status, model, policy, token counts, read rounds),
never message content, headers or keys.
"""

from __future__ import annotations

import os
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

from proxy.config.sections import TracingSettings

# W3C Trace Context: version-traceid-parentid-flags, lowercase hex. A later version may append
# fields after these four; its first four are read the same way.
_TRACEPARENT = re.compile(rb"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:-|$)")
SAMPLED = 0x01


def parse_traceparent(value: bytes | None) -> tuple[int, int, int] | None:
    """(trace id, parent span id, flags) of a valid ``traceparent``, else None (then the
    proxy starts a trace of its own, as the standard says)."""
    if not value:
        return None
    found = _TRACEPARENT.match(value.strip().lower())
    if found is None or found.group(1) == b"ff":
        return None
    trace_id, span_id = int(found.group(2), 16), int(found.group(3), 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, int(found.group(4), 16)


def format_traceparent(trace_id: int, span_id: int, flags: int) -> bytes:
    return b"00-%032x-%016x-%02x" % (trace_id, span_id, flags & 0xFF)


# Identifiers must be random and unique, not secret: a seeded generator, no system call each.
_ids = random.Random(int.from_bytes(os.urandom(16), "big"))


def new_span_id() -> int:
    return _ids.getrandbits(64) or 1


@dataclass(slots=True)
class SpanRecord:
    """One phase of a request: when it ran, and what the span will say of it."""

    name: str
    span_id: int
    start_ns: int
    end_ns: int = 0
    kind: str = "internal"  # internal, or client for a call upstream
    attributes: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def end(self, **attributes: Any) -> None:
        self.end_ns = time.time_ns()
        self.attributes.update(attributes)


@dataclass(slots=True)
class RequestTrace:
    """A request's trace while it is served: its identifiers and its phases."""

    trace_id: int
    span_id: int  # the request's own span
    parent_span_id: int | None  # the client's span, when it sent a traceparent
    flags: int
    start_ns: int
    tracestate: bytes | None = None
    spans: list[SpanRecord] = field(default_factory=list)

    @property
    def sampled(self) -> bool:
        return bool(self.flags & SAMPLED)

    def phase(
        self, name: str, attributes: dict[str, Any] | None = None, kind: str = "internal"
    ) -> SpanRecord:
        record = SpanRecord(name, new_span_id(), time.time_ns(), kind=kind, attributes=attributes or {})
        self.spans.append(record)
        return record

    def upstream_headers(
        self, headers: list[tuple[bytes, bytes]], call: SpanRecord
    ) -> list[tuple[bytes, bytes]]:
        """``headers`` with the client's trace headers replaced by this call's context."""
        kept = [(k, v) for k, v in headers if k not in (b"traceparent", b"tracestate")]
        kept.append((b"traceparent", format_traceparent(self.trace_id, call.span_id, self.flags)))
        if self.tracestate:
            kept.append((b"tracestate", self.tracestate))
        return kept


def upstream_call(trace: RequestTrace | None, url: str, **attributes: Any) -> SpanRecord | None:
    """The span of one call upstream (None: no trace), named as HTTP client spans are."""
    if trace is None:
        return None
    parts = urlsplit(url)
    described = {
        "http.request.method": "POST",
        "server.address": parts.hostname or "",
        "server.port": parts.port or (443 if parts.scheme == "https" else 80),
        "url.path": parts.path,
    }
    described.update((f"compaction.{k}", v) for k, v in attributes.items())
    return trace.phase("POST upstream", described, kind="client")


class TraceExport(Protocol):
    """What turns a served request's trace into spans (``proxy/otel_export.SpanExport``)."""

    def observe(self, exchange: Any) -> None: ...

    async def export_forever(self) -> None: ...

    async def shutdown(self) -> None: ...


class Tracer:
    """Starts a request's trace: the client's when it sent one, else a new one, sampled at
    ``sample_ratio``."""

    def __init__(self, settings: TracingSettings, rng: random.Random | None = None) -> None:
        self.ratio = settings.sample_ratio
        self.rng = rng or random.Random()

    def begin(self, headers: list[tuple[bytes, bytes]]) -> RequestTrace:
        parent = tracestate = None
        for name, value in headers:
            if name == b"traceparent":
                parent = parse_traceparent(value)
            elif name == b"tracestate":
                tracestate = value
        now = time.time_ns()
        if parent is not None:
            trace_id, parent_span, flags = parent
            return RequestTrace(trace_id, new_span_id(), parent_span, flags & SAMPLED, now, tracestate)
        trace_id = _ids.getrandbits(128) or 1
        flags = SAMPLED if self.rng.random() < self.ratio else 0
        return RequestTrace(trace_id, new_span_id(), None, flags, now)
