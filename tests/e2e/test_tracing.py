"""OpenTelemetry traces through every door, received by a real OTLP/HTTP endpoint started here
(the protocol's own protobuf messages decoded): a request span joined to the client's trace,
child spans for reading the body, compacting it, each call upstream and each answer's reads,
the upstream given the trace of the very call it answers, and no content or key in any span."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import openai
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.e2e import test_anthropic_door as messages_door
from tests.e2e import test_responses_door as responses_door
from tests.e2e.test_read_tool_output import HANDLE, history, read_call
from tests.fake_upstream import FakeUpstream, Recorded, Reply, completion, free_port

pytestmark = pytest.mark.e2e

KEY = "sk-tracing-0000000000000000"
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"


@dataclass
class Received:
    span: Span
    service: str

    @property
    def attributes(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for item in self.span.attributes:
            value = item.value
            found[item.key] = getattr(value, value.WhichOneof("value") or "string_value")
        return found


class Collector:
    """An OTLP/HTTP traces endpoint: decodes each export request into its spans."""

    def __init__(self) -> None:
        self.spans: list[Received] = []
        self.requests = 0
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                assert self.path == "/v1/traces" and self.headers["content-type"] == "application/x-protobuf"
                exported = ExportTraceServiceRequest.FromString(body)
                for resource_spans in exported.resource_spans:
                    service = next(
                        a.value.string_value
                        for a in resource_spans.resource.attributes
                        if a.key == "service.name"
                    )
                    for scope_spans in resource_spans.scope_spans:
                        collector.spans.extend(Received(span, service) for span in scope_spans.spans)
                collector.requests += 1
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *_: Any) -> None:
                pass

        self.port = free_port()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def trace(self, trace_id: str, at_least: int) -> list[Received]:
        """The spans of one trace once ``at_least`` have arrived (bounded wait)."""
        deadline = time.monotonic() + 15
        while True:
            found = [r for r in self.spans if r.span.trace_id.hex() == trace_id]
            if len(found) >= at_least or time.monotonic() > deadline:
                return found
            time.sleep(0.05)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def collector() -> Iterator[Collector]:
    started = Collector()
    yield started
    started.close()


def traced(collector: Collector, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        **extra,
        "tracing": {
            "enabled": True,
            "endpoint": collector.endpoint,
            "export_delay_ms": 50,
            "service_name": "cpx-test",
        },
    }


def tree(spans: list[Received]) -> tuple[Received, list[Received]]:
    """The request span and its children in start order; every span a child of the request."""
    roots = [r for r in spans if r.span.kind == Span.SPAN_KIND_SERVER]
    assert len(roots) == 1, [r.span.name for r in spans]
    root = roots[0]
    children = sorted((r for r in spans if r is not root), key=lambda r: r.span.start_time_unix_nano)
    assert all(c.span.parent_span_id == root.span.span_id for c in children)
    assert all(root.span.start_time_unix_nano <= c.span.start_time_unix_nano for c in children)
    assert all(c.span.end_time_unix_nano <= root.span.end_time_unix_nano for c in children)
    return root, children


def assert_upstream_saw_its_call(requests: list[Recorded], calls: list[Received], trace_id: str) -> None:
    """Each request upstream carried the traceparent of the span of that very call."""
    assert len(requests) == len(calls)
    for request, call in zip(requests, calls, strict=True):
        assert request.headers["traceparent"] == f"00-{trace_id}-{call.span.span_id.hex()}-01"


def assert_no_secret(spans: list[Received], *secrets: str) -> None:
    text = repr([(r.span.name, r.attributes) for r in spans])
    for secret in secrets:
        assert secret not in text


def test_a_chat_request_with_a_read_round_is_one_trace_joined_to_the_clients(
    start_proxy: Any, upstream: FakeUpstream, collector: Collector
) -> None:
    proxy = start_proxy(traced(collector, {"policy": "improved", "context_windows": {"default": 8192}}))

    def read_earlier(request: Recorded) -> Reply:
        handle = HANDLE.findall(request.body.decode())[0]
        return Reply(body=completion(tool_calls=[read_call({"handle": handle, "pattern": "SECRET"})]))

    upstream.queue(Reply(dynamic=read_earlier), Reply(body=completion("found 1234")))
    client = openai.OpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0)
    answer = client.chat.completions.create(
        model="gpt-4o", messages=history(), extra_headers={"traceparent": TRACEPARENT}
    )
    assert answer.choices[0].message.content == "found 1234"

    spans = collector.trace(CLIENT_TRACE, at_least=6)
    root, children = tree(spans)
    assert root.service == "cpx-test" and root.span.name == "POST chat"
    assert root.span.parent_span_id.hex() == CLIENT_SPAN  # joined to the client's span
    assert [c.span.name for c in children] == [
        "parse",
        "compaction",
        "POST upstream",
        "read_tool_output",
        "POST upstream",
    ]
    attributes = root.attributes
    assert attributes["gen_ai.request.model"] == "gpt-4o"
    assert attributes["gen_ai.provider.name"] == "openai"
    assert attributes["http.response.status_code"] == 200
    assert attributes["compaction.policy"] == "improved" and attributes["compaction.read_rounds"] == 1
    compaction = children[1].attributes
    assert compaction["compaction.trigger"] == "threshold"
    assert compaction["compaction.tokens_after"] < compaction["compaction.tokens_before"]
    calls = [c for c in children if c.span.kind == Span.SPAN_KIND_CLIENT]
    assert [c.attributes["compaction.round"] for c in calls] == [0, 1]
    assert all(c.attributes["http.response.status_code"] == 200 for c in calls)
    assert_upstream_saw_its_call(upstream.requests, calls, CLIENT_TRACE)
    assert_no_secret(spans, KEY, "SECRET-LINE", "Fix the bug")


def test_the_responses_and_messages_doors_are_traced_too(
    start_proxy: Any, upstream: FakeUpstream, collector: Collector
) -> None:
    proxy = start_proxy(traced(collector, responses_door.CONFIG))
    upstream.queue(
        Reply(dynamic=responses_door.reads_first_handle),
        Reply(body=responses_door.response([responses_door.message("value is 4242")], usage=20)),
    )
    other_trace = "0af7651916cd43dd8448eb211c80319c"
    openai.OpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0).responses.create(
        model="gpt-5",
        input=responses_door.history(),  # type: ignore[arg-type]
        store=False,
        extra_headers={"traceparent": f"00-{other_trace}-b7ad6b7169203331-01"},
    )
    root, children = tree(collector.trace(other_trace, at_least=6))
    assert root.span.name == "POST responses" and root.attributes["gen_ai.request.model"] == "gpt-5"
    calls = [c for c in children if c.span.kind == Span.SPAN_KIND_CLIENT]
    assert_upstream_saw_its_call(upstream.requests, calls, other_trace)

    # No traceparent from the client: the proxy starts the trace, and the upstream joins it.
    upstream.requests.clear()
    final = [messages_door.thinking("found it"), {"type": "text", "text": "value is 4242"}]
    upstream.queue(
        Reply(dynamic=messages_door.reads_first_handle), Reply(body=messages_door.message(final, usage=50))
    )
    anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0).messages.create(
        model="claude-sonnet-4-6",
        max_tokens=1024,
        messages=messages_door.history(),  # type: ignore[arg-type]
        tools=messages_door.TOOLS,  # type: ignore[arg-type]
        thinking={"type": "enabled", "budget_tokens": 512},
    )
    started = upstream.requests[0].headers["traceparent"].split("-")[1]
    root, children = tree(collector.trace(started, at_least=6))
    assert root.span.name == "POST anthropic" and not root.span.parent_span_id
    assert root.attributes["gen_ai.provider.name"] == "anthropic"
    calls = [c for c in children if c.span.kind == Span.SPAN_KIND_CLIENT]
    assert_upstream_saw_its_call(upstream.requests, calls, started)


def test_tracing_off_sends_the_clients_traceparent_as_it_came(
    start_proxy: Any, upstream: FakeUpstream
) -> None:
    proxy = start_proxy({})
    upstream.queue(Reply(body=completion("ok")))
    openai.OpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0).chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"traceparent": TRACEPARENT},
    )
    assert upstream.requests[-1].headers["traceparent"] == TRACEPARENT
