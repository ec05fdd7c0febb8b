"""OTLP's trace messages written in protobuf's wire format, for the handful of fields the proxy's
spans use (``opentelemetry/proto/trace/v1/trace.proto`` and ``common.proto``, version 1).

Written by hand because it is on the request path: building the same messages with the
protobuf classes costs about 95 us per request (most of it one Python object per attribute),
this about a fifth of that, and a repeated attribute (a method, a route, a policy) is encoded
once and reused. The tests decode every shape written here with the protocol's own classes.
Concatenated export requests are one export request (protobuf merges repeated fields), which
is how a batch is made of requests encoded one at a time.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Any

# Span.SpanKind and Status.StatusCode values.
KIND_INTERNAL, KIND_SERVER, KIND_CLIENT = 1, 2, 3
STATUS_ERROR = 2
_CACHED_ATTRIBUTES = 4096


_SMALL = [bytes((i,)) for i in range(128)]


def varint(value: int) -> bytes:
    if 0 <= value < 128:
        return _SMALL[value]  # every tag, and most lengths of keys and names
    value &= (1 << 64) - 1  # an int64 below zero is written as its two's complement
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field_bytes(number: int, payload: bytes) -> bytes:
    """A length-delimited field: a string, bytes or an embedded message."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def field_varint(number: int, value: int) -> bytes:
    return varint(number << 3) + varint(value)


def field_fixed64(number: int, value: int) -> bytes:
    return varint(number << 3 | 1) + struct.pack("<Q", value)


def any_value(value: Any) -> bytes:
    """An ``AnyValue``: string 1, bool 2, int 3, double 4."""
    if isinstance(value, bool):
        return field_varint(2, int(value))
    if isinstance(value, int):
        return field_varint(3, value)
    if isinstance(value, float):
        return varint(4 << 3 | 1) + struct.pack("<d", value)
    return field_bytes(1, str(value).encode("utf-8", "replace"))


class Attributes:
    """``KeyValue`` fields of a message (field 9 of a span, 1 of a resource): a string or bool
    value's encoding is kept (most recur on every request), but for ``unique`` keys (a request
    id: kept, they would only fill the memo)."""

    def __init__(self, field_number: int, unique: Iterable[str] = ()) -> None:
        self.field_number = field_number
        self.unique = frozenset(unique)
        self._known: dict[tuple[str, Any, type], bytes] = {}

    def encode(self, found: Mapping[str, Any]) -> bytes:
        out: list[bytes] = []
        for key, value in found.items():
            if value is None:
                continue
            memo = (key, value, type(value))
            encoded = self._known.get(memo)
            if encoded is None:
                pair = field_bytes(1, key.encode()) + field_bytes(2, any_value(value))
                encoded = field_bytes(self.field_number, pair)
                recurs = key not in self.unique and (
                    isinstance(value, str | bool) or (isinstance(value, int) and 0 <= value < 1024)
                )
                if recurs and len(self._known) < _CACHED_ATTRIBUTES:
                    self._known[memo] = encoded
            out.append(encoded)
        return b"".join(out)


def span(
    *,
    trace_id: bytes,
    span_id: bytes,
    parent_span_id: bytes,
    name: str,
    kind: int,
    start_ns: int,
    end_ns: int,
    attributes: bytes,
    error: str | None,
) -> bytes:
    """A ``Span`` message (``attributes`` already encoded as its field 9)."""
    parts = [field_bytes(1, trace_id), field_bytes(2, span_id)]
    if parent_span_id:
        parts.append(field_bytes(4, parent_span_id))
    parts += [
        field_bytes(5, name.encode("utf-8", "replace")),
        field_varint(6, kind),
        field_fixed64(7, start_ns),
        field_fixed64(8, end_ns),
        attributes,
    ]
    if error is not None:
        status = field_bytes(2, error.encode("utf-8", "replace")) + field_varint(3, STATUS_ERROR)
        parts.append(field_bytes(15, status))
    return b"".join(parts)


def resource(attributes: bytes) -> bytes:
    """A ``Resource`` message (``attributes`` encoded as its field 1)."""
    return attributes


def scope(name: str, version: str) -> bytes:
    """An ``InstrumentationScope`` message."""
    return field_bytes(1, name.encode()) + field_bytes(2, version.encode())


def export_request(resource_message: bytes, scope_message: bytes, spans: Iterable[bytes]) -> bytes:
    """An ``ExportTraceServiceRequest`` holding one resource's spans of one scope."""
    scope_spans = field_bytes(1, scope_message) + b"".join(field_bytes(2, s) for s in spans)
    resource_spans = field_bytes(1, resource_message) + field_bytes(2, scope_spans)
    return field_bytes(1, resource_spans)
