"""The Anthropic Messages door, end to end with the official ``anthropic`` SDK against a scripted
upstream: compacted like chat (non-stream and stream, read_tool_output answered inside the proxy
as an Anthropic tool), thinking and signatures kept, the summary cached, errors in Anthropic's
shape, other Anthropic routes relayed verbatim, Claude Code's own bodies untouched when nothing
needs compacting, and the token factor calibrated from the usage the upstream reports."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import orjson
import pytest

from policies.tokens import TokenCounter
from proxy.dialects.anthropic import AnthropicDialect
from tests.anthropic_protocol import breakpoints, problems
from tests.fake_upstream import FakeUpstream, Recorded, Reply

pytestmark = pytest.mark.e2e

CONFIG = {"policy": "improved", "context_windows": {"default": 8000}}
KEY = "sk-ant-door-000000000000"
HANDLE = re.compile(r"handle=(out_[0-9a-f]{16})")
CLIENTS = Path(__file__).resolve().parents[1] / "fixtures" / "clients"


def message(content: list[dict[str, Any]], *, usage: int = 10, stop: str | None = None) -> dict[str, Any]:
    tool = any(b["type"] == "tool_use" for b in content)
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-6",
        "content": content,
        "stop_reason": stop or ("tool_use" if tool else "end_turn"),
        "stop_sequence": None,
        "usage": {"input_tokens": usage, "output_tokens": 3},
    }


def thinking(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": "sig-" + text.replace(" ", "-")}


def history(steps: int = 10) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the parser."}]
    for i in range(steps):
        lines = [f"file {i} line {n}: " + "token " * 8 for n in range(80)]
        if i == 0:
            lines[41] = "SECRET-LINE value=4242"
        call = {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": {"command": f"cat f{i}.py"}}
        messages.append({"role": "assistant", "content": [thinking(f"step {i}"), call]})
        result = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": "\n".join(lines)}
        messages.append({"role": "user", "content": [result]})
    return messages


TOOLS = [
    {"name": "Bash", "description": "Run a command.", "input_schema": {"type": "object", "properties": {}}}
]


def recorded_events(proxy: Any, count: int) -> list[dict[str, Any]]:
    """The tenant's events, once ``count`` are recorded (they are written after the answer)."""
    deadline = time.monotonic() + 10
    while True:
        events: list[dict[str, Any]] = httpx.get(
            proxy.url + "/v1/compaction/events", headers={"x-api-key": KEY}
        ).json()["data"]
        if len(events) >= count or time.monotonic() > deadline:
            return events
        time.sleep(0.05)


def sdk(proxy: Any, **options: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0, **options)


def reads_first_handle(request: Recorded) -> Reply:
    handle = HANDLE.findall(request.body.decode())[0]
    call = {
        "type": "tool_use",
        "id": "toolu_read",
        "name": "read_tool_output",
        "input": {"handle": handle, "pattern": "SECRET"},
    }
    return Reply(body=message([thinking("I should read it"), call], usage=100))


def test_a_long_history_is_compacted_and_reads_are_answered(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy(CONFIG)
    final = [thinking("found it"), {"type": "text", "text": "value is 4242"}]
    upstream.queue(Reply(dynamic=reads_first_handle), Reply(body=message(final, usage=50)))
    raw = sdk(proxy).messages.with_raw_response.create(
        model="claude-sonnet-4-6",
        max_tokens=1024,
        messages=history(),  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[list-item]
        thinking={"type": "enabled", "budget_tokens": 512},
    )
    answer = raw.parse()
    assert [b.type for b in answer.content] == ["thinking", "text"]
    assert answer.content[1].text == "value is 4242"  # type: ignore[union-attr]
    # The last round's prompt (the context the answer came from), every round's output.
    assert answer.usage.input_tokens == 50 and answer.usage.output_tokens == 6
    assert (
        raw.headers["x-compaction-trigger"] == "threshold" and raw.headers["x-compaction-read-rounds"] == "1"
    )
    first, second = (r.json() for r in upstream.requests)
    assert upstream.requests[0].path == "/v1/messages"
    sent_headers = upstream.requests[0].headers
    # The client's credential (this SDK sends it as a bearer) and API version, as it sent them.
    assert KEY in (
        sent_headers.get("x-api-key", ""),
        sent_headers.get("authorization", "").removeprefix("Bearer "),
    )
    assert sent_headers["anthropic-version"]
    assert [t["name"] for t in first["tools"]] == ["Bash", "read_tool_output"]
    assert "input_schema" in first["tools"][1]
    assert problems(first) == [] and problems(second) == []
    # Thinking reaches the upstream exactly as the client sent it.
    sent = {
        b["thinking"]: b["signature"]
        for m in first["messages"]
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "thinking"
    }
    assert sent and all(signature == "sig-" + text.replace(" ", "-") for text, signature in sent.items())
    # The summary is cached: one breakpoint, on its block.
    assert breakpoints(first) == 1
    # The read went back with its thinking and call, answered by a tool_result.
    assistant, results = second["messages"][-2:]
    assert [b["type"] for b in assistant["content"]] == ["thinking", "tool_use"]
    assert results["content"][0]["tool_use_id"] == "toolu_read"
    assert "SECRET-LINE value=4242" in results["content"][0]["content"]


def anthropic_stream(content: list[dict[str, Any]], usage: int) -> list[bytes]:
    def event(payload: dict[str, Any]) -> bytes:
        return f"event: {payload['type']}\ndata: {json.dumps(payload)}\n\n".encode()

    start = message([], usage=usage) | {"stop_reason": None}
    events = [event({"type": "message_start", "message": start}), event({"type": "ping"})]
    for index, block in enumerate(content):
        kind = block["type"]
        opening = {"type": kind, "text": ""} if kind == "text" else dict(block)
        if kind == "tool_use":
            opening["input"] = {}
        if kind == "thinking":
            opening = {"type": "thinking", "thinking": "", "signature": ""}
        events.append(event({"type": "content_block_start", "index": index, "content_block": opening}))
        if kind == "text":
            for word in block["text"].split(" "):
                delta = {"type": "text_delta", "text": word + " "}
                events.append(event({"type": "content_block_delta", "index": index, "delta": delta}))
        elif kind == "thinking":
            delta = {"type": "thinking_delta", "thinking": block["thinking"]}
            events.append(event({"type": "content_block_delta", "index": index, "delta": delta}))
            delta = {"type": "signature_delta", "signature": block["signature"]}
            events.append(event({"type": "content_block_delta", "index": index, "delta": delta}))
        elif kind == "tool_use":
            text = json.dumps(block["input"])
            for part in (text[: len(text) // 2], text[len(text) // 2 :]):
                delta = {"type": "input_json_delta", "partial_json": part}
                events.append(event({"type": "content_block_delta", "index": index, "delta": delta}))
        events.append(event({"type": "content_block_stop", "index": index}))
    stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
    events.append(
        event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": 7},
            }
        )
    )
    events.append(event({"type": "message_stop"}))
    return events


def test_a_stream_over_two_rounds_is_one_well_formed_stream(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy(CONFIG)

    def streamed_read(request: Recorded) -> Reply:
        content = reads_first_handle(request).body["content"]
        return Reply(
            kind="sse",
            chunks=anthropic_stream([{"type": "text", "text": "Let me look."}, *content], 100),
            done=False,
        )

    agent_call = {
        "type": "tool_use",
        "id": "toolu_next",
        "name": "Bash",
        "input": {"command": "grep -n 4242 f0.py"},
    }
    final = [thinking("now grep"), {"type": "text", "text": "Found it."}, agent_call]
    upstream.queue(
        Reply(dynamic=streamed_read), Reply(kind="sse", chunks=anthropic_stream(final, 50), done=False)
    )
    client = sdk(proxy)
    with client.messages.stream(
        model="claude-sonnet-4-6",
        max_tokens=1024,
        messages=history(),
        tools=TOOLS,  # type: ignore[arg-type]
    ) as stream:
        events = list(stream)
        answer = stream.get_final_message()
    kinds = [e.type for e in events]
    assert kinds.count("message_start") == 1 and kinds.count("message_stop") == 1
    # The second round's thinking, text and the agent's call; the read round's short text
    # ("Let me look.", dropped from a non-streamed answer too), the read call and the thinking
    # before it never reach the client.
    assert [b.type for b in answer.content] == ["thinking", "text", "tool_use"]
    assert answer.content[1].text.strip() == "Found it."  # type: ignore[union-attr]
    assert answer.content[2].input == {"command": "grep -n 4242 f0.py"}  # type: ignore[union-attr]
    assert answer.stop_reason == "tool_use"
    assert answer.usage.input_tokens == 50 and answer.usage.output_tokens == 14
    starts = [e.index for e in events if e.type == "content_block_start"]  # type: ignore[union-attr]
    assert starts == [0, 1, 2]
    assert "read_tool_output" not in json.dumps([b.model_dump() for b in answer.content])
    follow_up = upstream.requests[1].json()["messages"]
    assert [b["type"] for b in follow_up[-2]["content"]] == ["text", "thinking", "tool_use"]
    assert follow_up[-2]["content"][1]["signature"] == "sig-I-should-read-it"


def test_a_failure_after_the_stream_started_is_an_error_event(
    start_proxy: Any, upstream: FakeUpstream
) -> None:
    proxy = start_proxy(CONFIG)
    # Longer than the first characters of a round the proxy holds (HELD_TEXT_CHARS): the
    # stream has started with it when the next round fails.
    long_text = " ".join(f"Let me look at part {n} of the saved output." for n in range(14))

    def text_then_read(request: Recorded) -> Reply:
        content = reads_first_handle(request).body["content"]
        return Reply(
            kind="sse",
            chunks=anthropic_stream([{"type": "text", "text": long_text}, *content], 100),
            done=False,
        )

    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    upstream.queue(Reply(dynamic=text_then_read), Reply(status=529, body=overloaded))
    seen: list[Any] = []
    with pytest.raises(anthropic.APIStatusError) as raised:
        stream = sdk(proxy).messages.create(
            model="claude-sonnet-4-6",
            max_tokens=1024,
            messages=history(),
            tools=TOOLS,
            stream=True,  # type: ignore[arg-type]
        )
        for event in stream:
            seen.append(event)
    assert "HTTP 529" in str(raised.value)
    assert "message_stop" not in [e.type for e in seen]
    assert any(e.type == "content_block_delta" for e in seen)


def test_a_failure_after_a_short_preamble_keeps_its_real_status(
    start_proxy: Any, upstream: FakeUpstream
) -> None:
    """A read round's short text never reached the client, so the next round's failure comes
    before any byte: the client gets the upstream's own status and error body."""
    proxy = start_proxy(CONFIG)

    def text_then_read(request: Recorded) -> Reply:
        content = reads_first_handle(request).body["content"]
        return Reply(
            kind="sse",
            chunks=anthropic_stream([{"type": "text", "text": "Let me look."}, *content], 100),
            done=False,
        )

    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    upstream.queue(Reply(dynamic=text_then_read), Reply(status=529, body=overloaded))
    with pytest.raises(anthropic.APIStatusError) as raised:
        stream = sdk(proxy).messages.create(
            model="claude-sonnet-4-6",
            max_tokens=1024,
            messages=history(),
            tools=TOOLS,
            stream=True,  # type: ignore[arg-type]
        )
        list(stream)
    assert raised.value.status_code == 529 and "Overloaded" in str(raised.value)


def test_errors_before_the_response_are_anthropic_errors(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy(CONFIG)
    client = sdk(proxy)
    # The upstream's own error, relayed as it came.
    upstream.queue(
        Reply(
            status=429,
            body={"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}},
            headers={"retry-after": "7"},
        )
    )
    with pytest.raises(anthropic.RateLimitError) as limited:
        client.messages.create(
            model="claude-sonnet-4-6", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
        )
    assert limited.value.response.headers["retry-after"] == "7"
    for status, kind, raised in (
        (401, "authentication_error", anthropic.AuthenticationError),
        (529, "overloaded_error", anthropic.APIStatusError),
        (400, "invalid_request_error", anthropic.BadRequestError),
    ):
        error = {"type": "error", "error": {"type": kind, "message": kind}}
        upstream.queue(Reply(status=status, body=error, headers={"retry-after": "3"}))
        with pytest.raises(raised) as caught:
            client.messages.create(model="m", max_tokens=64, messages=[{"role": "user", "content": "hi"}])
        assert isinstance(caught.value, anthropic.APIStatusError) and caught.value.status_code == status
        assert caught.value.body == error and caught.value.response.headers["retry-after"] == "3"
    # The proxy's own errors, in Anthropic's shape.
    answer = httpx.post(proxy.url + "/v1/messages", content=b"{not json", headers={"x-api-key": KEY})
    assert answer.status_code == 400
    assert answer.json()["type"] == "error" and answer.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(
            model="m", max_tokens=64, messages=[], extra_headers={"x-compaction-policy": "nope"}
        )
    upstream.queue(Reply(kind="reset"))
    with pytest.raises(anthropic.InternalServerError) as unreachable:
        client.messages.create(model="m", max_tokens=64, messages=[{"role": "user", "content": "hi"}])
    assert unreachable.value.status_code == 502 and unreachable.value.body["error"]["type"] == "api_error"  # type: ignore[index]


def test_other_anthropic_routes_are_relayed_verbatim(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy(
        {
            **CONFIG,
            "anthropic": {
                "base_url": upstream.base_url.removesuffix("/v1") + "/ant",
                "api_key": "sk-ant-configured",
            },
            "server": {"allow_anonymous": True},
        }
    )
    upstream.queue(Reply(body={"input_tokens": 1234}))
    body = {"model": "claude-sonnet-4-6", "messages": [{"role": "user", "content": "hi"}]}
    counted = sdk(proxy).messages.count_tokens(
        **body, extra_headers={"anthropic-beta": "token-counting-2024-11-01"}
    )  # type: ignore[arg-type]
    assert counted.input_tokens == 1234
    request = upstream.requests[-1]
    assert request.path == "/ant/v1/messages/count_tokens" and request.json() == body
    assert request.headers["anthropic-beta"] == "token-counting-2024-11-01"
    assert "sk-ant-configured" not in request.headers.values()  # the client's own key wins
    # A client without a key gets the configured one, as x-api-key.
    httpx.post(
        proxy.url + "/v1/messages/count_tokens?beta=true",
        json=body,
        headers={"anthropic-version": "2023-06-01"},
    )
    assert upstream.requests[-1].headers["x-api-key"] == "sk-ant-configured"
    assert upstream.requests[-1].query == "beta=true"
    # A route both providers have goes to Anthropic when the request says it is Anthropic's.
    httpx.get(proxy.url + "/v1/models", headers={"anthropic-version": "2023-06-01", "x-api-key": KEY})
    assert upstream.requests[-1].path == "/ant/v1/models"
    httpx.get(proxy.url + "/v1/models", headers={"authorization": "Bearer sk-openai"})
    assert upstream.requests[-1].path == "/v1/models"


def test_claude_code_bodies_go_upstream_byte_for_byte(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy({"policy": "improved"})  # the default 200k window: nothing to compact
    for turn in (1, 2, 3, 4):
        raw = (CLIENTS / f"claude-code-turn{turn}.json").read_bytes()
        upstream.queue(Reply(body=message([{"type": "text", "text": "ok"}])))
        answer = httpx.post(
            proxy.url + "/v1/messages?beta=true",
            content=raw,
            headers={"x-api-key": KEY, "anthropic-version": "2023-06-01", "content-type": "application/json"},
        )
        assert answer.status_code == 200
        assert upstream.requests[-1].body == raw and upstream.requests[-1].query == "beta=true"


def test_claude_codes_own_compaction_is_recognized(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy({"policy": "improved"})
    body = orjson.loads((CLIENTS / "claude-code-manual-compact.json").read_bytes())
    # The fixture's prompt text is filler; Claude Code's real prompt opens like this.
    body["messages"][-1]["content"][-1]["text"] = (
        "Your task is to create a detailed summary of the conversation so far."
    )
    upstream.queue(Reply(body=message([{"type": "text", "text": "<summary>...</summary>"}])))
    answer = httpx.post(proxy.url + "/v1/messages", json=body, headers={"x-api-key": KEY})
    assert answer.status_code == 200
    assert answer.headers["x-compaction-skipped"] == "claude-code's own compaction request"
    assert upstream.requests[-1].json() == body
    events = recorded_events(proxy, 1)
    assert events[0]["dialect"] == "anthropic"
    assert events[0]["dialect_notes"]["agent_compaction"] == {
        "agent": "claude-code",
        "action": "forwarded as sent",
    }


def test_the_token_factor_is_calibrated_from_reported_usage(
    start_proxy: Any, upstream: FakeUpstream, tmp_path: Path
) -> None:
    """The upstream reports 1.1 times the proxy's count (part of it as cache reads): after three
    answers the factor is 1.1 plus the 2% margin, recorded in each event, kept across a restart."""
    counter, dialect = TokenCounter(), AnthropicDialect()

    def reported(request: Recorded) -> Reply:
        tokens = round(1.1 * dialect.count(request.json(), counter))
        usage = {"input_tokens": tokens - 300, "cache_read_input_tokens": 300, "output_tokens": 2}
        return Reply(body=message([{"type": "text", "text": "ok"}]) | {"usage": usage})

    def send(proxy: Any, steps: int) -> None:
        upstream.queue(Reply(dynamic=reported))
        answer = httpx.post(
            proxy.url + "/v1/messages",
            json={"model": "claude-sonnet-4-6", "max_tokens": 64, "messages": history(steps)},
            headers={"x-api-key": KEY},
        )
        assert answer.status_code == 200

    state = tmp_path / "state"
    config = {"policy": "improved", "events": {"record_skipped": True}}
    proxy = start_proxy(config, state_dir=state)
    for steps in range(4, 8):
        send(proxy, steps)
    events = recorded_events(proxy, 4)
    counts = [e["token_count"] for e in sorted(events, key=lambda e: e["time"])]
    assert [c["factor"] for c in counts[:3]] == [1.3, 1.3, 1.3]  # the configured default
    assert counts[3]["factor"] == pytest.approx(1.1 * 1.02, abs=0.002)
    assert all(c["ratio"] == pytest.approx(1.1, abs=0.002) for c in counts)
    assert all(c["reported"] == round(1.1 * c["counted"]) for c in counts)
    proxy.stop()
    restarted = start_proxy(config, state_dir=state)
    send(restarted, 4)
    latest = max(recorded_events(restarted, 5), key=lambda e: e["time"])
    assert latest["token_count"]["factor"] == pytest.approx(1.1 * 1.02, abs=0.002)


def test_the_base_url_answers_the_probe_claude_code_sends(start_proxy: Any) -> None:
    proxy = start_proxy(CONFIG)
    assert httpx.head(proxy.url + "/").status_code == 200
    assert httpx.get(proxy.url + "/").json() == {"service": "compaction-proxy", "status": "ok"}


def test_shadow_mode_sends_the_original_and_compares_the_views_decision(
    start_proxy: Any, upstream: FakeUpstream
) -> None:
    """Shadow mode through the Messages door: the client's request goes as sent, the compacted
    view is asked in the background, and the two next actions are compared in the event."""
    config = {**CONFIG, "mode": "shadow", "shadow": {"compare": True, "sample_rate": 1.0}}
    proxy = start_proxy(config)
    real = {"type": "tool_use", "id": "toolu_real", "name": "Bash", "input": {"command": "pytest -q"}}
    other = {"type": "tool_use", "id": "toolu_other", "name": "Read", "input": {"file_path": "/x.py"}}
    upstream.queue(Reply(body=message([real])), Reply(body=message([other])))
    messages = history()
    body = {"model": "claude-sonnet-4-6", "max_tokens": 1024, "messages": messages, "tools": TOOLS}
    answer = httpx.post(proxy.url + "/v1/messages", json=body, headers={"x-api-key": KEY})
    assert answer.status_code == 200 and answer.json()["content"] == [real]
    assert upstream.requests[0].json() == body  # the original, as sent
    deadline = time.monotonic() + 10
    while True:
        compared = [e for e in recorded_events(proxy, 1) if e.get("shadow_compare")]
        if compared or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert compared and compared[0]["dialect"] == "anthropic"
    result = compared[0]["shadow_compare"]
    assert (result["real"], result["shadow"], result["diverged"]) == ("Bash: pytest -q", "Read: /x.py", True)
    shadow_request = upstream.requests[1].json()
    assert "stream" not in shadow_request and problems(shadow_request) == []
