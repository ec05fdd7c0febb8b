"""The Responses API door, in process: items read into the neutral conversation and written back
with every untouched item exactly as it came; compaction keeps the protocol and reasoning
items intact; the stream codec turns several upstream rounds into one well-formed stream."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from policies.conversation import parse
from policies.pipeline import build_policies
from policies.tokens import TokenCounter
from proxy.config.settings import Settings, policy_specs
from proxy.dialects.base import NOT_RUN, Answer
from proxy.dialects.responses import ResponsesDialect
from proxy.wire.errors import ProxyError
from proxy.wire.response_writer import ResponseWriter

CLIENTS = Path(__file__).resolve().parents[2] / "fixtures" / "clients"
DIALECT = ResponsesDialect()
COUNTER = TokenCounter()
POLICIES = build_policies(policy_specs(Settings()))


def codex(name: str) -> dict[str, Any]:
    body: dict[str, Any] = orjson.loads((CLIENTS / f"{name}.json").read_bytes())
    return body


@pytest.mark.parametrize(
    "name",
    [
        "codex-turn1",
        "codex-turn4",
        "codex-local-compaction",
        "codex-after-compaction",
        "codex-fallback-model-turn1",
    ],
)
def test_real_codex_bodies_round_trip_byte_for_byte(name: str) -> None:
    body = codex(name)
    parsed = DIALECT.parse(body)
    messages = parsed.neutral["messages"]
    assert orjson.dumps(DIALECT.render(parsed, messages, range(len(messages)))) == orjson.dumps(body)
    assert parse(messages).problems == ()


def test_a_turn_is_its_reasoning_message_and_calls() -> None:
    parsed = DIALECT.parse(codex("codex-turn4"))
    roles = [m["role"] for m in parsed.neutral["messages"]]
    assert roles == ["developer", "developer", "user", "user"] + ["assistant", "tool"] * 3
    turn = parsed.neutral["messages"][4]
    assert turn["tool_calls"][0]["function"]["name"] == "exec_command"
    assert json.loads(turn["tool_calls"][0]["function"]["arguments"]) == {"cmd": "ls -la"}
    assert parsed.neutral["messages"][5]["tool_call_id"] == turn["tool_calls"][0]["id"]


def agent_run(steps: int, *, instructions: bool = True) -> dict[str, Any]:
    items: list[Any] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the bug."}]}
    ]
    for i in range(steps):
        items += [
            {
                "type": "reasoning",
                "id": f"rs_{i}",
                "summary": [],
                "encrypted_content": f"gAAAA-{i}-" + "x" * 40,
            },
            {
                "type": "function_call",
                "id": f"fc_{i}",
                "call_id": f"call_{i}",
                "name": "exec_command",
                "arguments": json.dumps({"cmd": f"pytest -k t{i}"}),
            },
            {
                "type": "function_call_output",
                "call_id": f"call_{i}",
                "output": "\n".join(f"t{i} line {n}: " + "ok " * 12 for n in range(80)),
            },
        ]
        if i == 3:
            items.append(
                {
                    "type": "custom_tool_call",
                    "id": "ctc_1",
                    "call_id": "call_patch",
                    "name": "apply_patch",
                    "input": "*** Begin Patch\n*** Update File: a.py\n@@\n-a\n+b\n*** End Patch",
                }
            )
            items.append({"type": "custom_tool_call_output", "call_id": "call_patch", "output": "Success."})
            items.append({"type": "web_search_call", "id": "ws_1", "status": "completed"})
    body: dict[str, Any] = {
        "model": "gpt-5",
        "input": items,
        "store": False,
        "include": ["reasoning.encrypted_content"],
    }
    if instructions:
        body["instructions"] = "You are a coding agent."
    return body


def compact(body: dict[str, Any], window: int, policy: str = "improved") -> tuple[dict[str, Any], Any]:
    parsed = DIALECT.parse(body)
    outcome = asyncio.run(POLICIES[policy].apply(parsed.neutral, COUNTER, window=window))
    assert outcome.messages is not None and outcome.origin is not None
    return DIALECT.render(parsed, outcome.messages, outcome.origin), outcome


def protocol_problems(items: list[Any]) -> list[str]:
    problems = []
    calls = {i["call_id"] for i in items if i.get("type") in ("function_call", "custom_tool_call")}
    outputs = {
        i["call_id"] for i in items if i.get("type") in ("function_call_output", "custom_tool_call_output")
    }
    problems += [f"call {c} without output" for c in calls - outputs]
    problems += [f"output {c} without call" for c in outputs - calls]
    for position, item in enumerate(items):
        if item.get("type") == "reasoning":
            following = items[position + 1] if position + 1 < len(items) else None
            if (
                following is None
                or following.get("type") not in ("function_call", "custom_tool_call", "message", "reasoning")
                or following.get("role") == "user"
            ):
                problems.append(f"reasoning {item['id']} not followed by its item")
    return problems


def test_compaction_keeps_the_protocol_reasoning_and_unknown_items() -> None:
    body = agent_run(20)
    view, outcome = compact(body, window=8000)
    items = view["input"]
    assert outcome.tokens_after < outcome.tokens_before
    assert protocol_problems(items) == []
    # Untouched items are the very objects (bytes) the client sent; reasoning never altered.
    originals = {i.get("id"): i for i in body["input"] if i.get("id")}
    for item in items:
        if item.get("type") == "reasoning":
            assert item == originals[item["id"]]
    # The item the proxy does not understand is kept, in place after its neighbours.
    assert [i for i in items if i.get("type") == "web_search_call"] == [
        {"type": "web_search_call", "id": "ws_1", "status": "completed"}
    ]
    assert view["instructions"] == "You are a coding agent."
    # The summary is an input message naming the saved outputs; the tail's items are as sent.
    assert any(i.get("type") == "message" and "State ledger" in json.dumps(i) for i in items)
    assert "handle=out_" in json.dumps(items)
    assert items[-3:] == body["input"][-3:]
    assert DIALECT.count(view, COUNTER) == outcome.tokens_after


def test_history_held_upstream_is_not_compacted() -> None:
    body = {**agent_run(20), "previous_response_id": "resp_123"}
    assert DIALECT.parse(body).skipped == "previous_response_id: the history is held upstream"


def test_a_plain_string_input() -> None:
    parsed = DIALECT.parse({"model": "gpt-5", "input": "hello"})
    assert parsed.neutral["messages"] == [{"role": "user", "content": "hello"}]
    with pytest.raises(ProxyError):
        DIALECT.parse({"model": "gpt-5", "input": 5})


def test_a_read_round_goes_back_with_its_reasoning() -> None:
    body = DIALECT.with_read_tool({"model": "gpt-5", "input": "hi", "tools": []}, 1000)
    reasoning = {"type": "reasoning", "id": "rs_r", "encrypted_content": "E"}
    read = {
        "type": "function_call",
        "id": "fc_r",
        "call_id": "call_r",
        "name": "read_tool_output",
        "arguments": '{"handle": "out_0"}',
    }
    agent = {
        "type": "function_call",
        "id": "fc_a",
        "call_id": "call_a",
        "name": "exec_command",
        "arguments": "{}",
    }
    answer = Answer(calls=[read, agent], items=[reasoning, read, agent])
    after = DIALECT.add_round(body, answer, [(read, "the lines")])
    # the whole answer goes back as the model wrote it (reasoning items are bound to it); the agent's
    # call in it is answered NOT_RUN so the model re-issues it once it has read what it asked for.
    assert [i.get("type") for i in after["input"]] == [
        "message",
        "reasoning",
        "function_call",
        "function_call",
        "function_call_output",
        "function_call_output",
    ]
    outputs = {i["call_id"]: i["output"] for i in after["input"] if i.get("type") == "function_call_output"}
    assert outputs == {"call_r": "the lines", "call_a": NOT_RUN}
    assert [t["name"] for t in DIALECT.without_read_tool(after).get("tools", [])] == []


# --- the stream codec ------------------------------------------------------------------------


def event(payload: dict[str, Any]) -> bytes:
    return b"event: " + payload["type"].encode() + b"\ndata: " + orjson.dumps(payload)


def round_events(items: list[dict[str, Any]], usage: dict[str, int]) -> list[bytes]:
    events = [
        event({"type": "response.created", "response": {"id": "resp_x", "output": []}}),
        event({"type": "response.in_progress", "response": {"id": "resp_x"}}),
    ]
    for index, item in enumerate(items):
        events.append(
            event(
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "status": "in_progress"},
                }
            )
        )
        if item["type"] == "message":
            text = item["content"][0]["text"]
            events.append(
                event(
                    {
                        "type": "response.output_text.delta",
                        "output_index": index,
                        "content_index": 0,
                        "delta": text,
                    }
                )
            )
        events.append(event({"type": "response.output_item.done", "output_index": index, "item": item}))
    events.append(
        event({"type": "response.completed", "response": {"id": "resp_x", "output": items, "usage": usage}})
    )
    return events


def decode(raw: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: ")]


def test_two_rounds_become_one_well_formed_stream() -> None:
    sent: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            sent.append(message["body"])

    reasoning1 = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "E1"}
    note = {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Let me look."}],
    }
    read = {
        "type": "function_call",
        "id": "fc_r",
        "call_id": "call_r",
        "name": "read_tool_output",
        "arguments": "{}",
    }
    reasoning2 = {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "E2"}
    call = {
        "type": "function_call",
        "id": "fc_2",
        "call_id": "call_2",
        "name": "exec_command",
        "arguments": '{"cmd": "ls"}',
    }

    async def run() -> None:
        writer = ResponseWriter(send)
        writer.start(200, [], streaming=True)
        first = DIALECT.codec(writer)
        for raw in round_events(
            [note, reasoning1, read], {"input_tokens": 100, "output_tokens": 5, "total_tokens": 105}
        ):
            await first.take(raw)
        assert [c["name"] for c in first.calls()] == ["read_tool_output"] and first.complete
        second = DIALECT.codec(writer)
        for raw in round_events(
            [reasoning2, call], {"input_tokens": 120, "output_tokens": 7, "total_tokens": 127}
        ):
            await second.take(raw)
        await second.finish({"input_tokens": 220, "output_tokens": 12, "total_tokens": 232})

    asyncio.run(run())
    events = decode(b"".join(sent))
    kinds = [e["type"] for e in events]
    assert kinds.count("response.created") == 1 and kinds[-1] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert "read_tool_output" not in json.dumps(events) and "E1" not in json.dumps(events)
    # The read round's short text ("Let me look.") is dropped, as a non-streamed answer drops it.
    assert "Let me look." not in json.dumps(events)
    completed = events[-1]["response"]
    assert [i["id"] for i in completed["output"]] == ["rs_2", "fc_2"]
    assert completed["usage"] == {"input_tokens": 220, "output_tokens": 12, "total_tokens": 232}
    # Items are numbered in the order the client receives them.
    added = [
        (e["output_index"], e["item"]["id"]) for e in events if e["type"] == "response.output_item.added"
    ]
    assert added == [(0, "rs_2"), (1, "fc_2")]


def test_a_round_that_only_reads_sends_nothing() -> None:
    sent: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message.get("body", b""))

    read = {
        "type": "function_call",
        "id": "fc_r",
        "call_id": "call_r",
        "name": "read_tool_output",
        "arguments": "{}",
    }

    async def run() -> ResponseWriter:
        writer = ResponseWriter(send)
        writer.start(200, [], streaming=True)
        codec = DIALECT.codec(writer)
        for raw in round_events([{"type": "reasoning", "id": "rs", "encrypted_content": "E"}, read], {}):
            await codec.take(raw)
        return writer

    writer = asyncio.run(run())
    assert not writer.started and sent == []


def test_offloaded_outputs_keep_their_call_and_item_fields() -> None:
    body = agent_run(20)
    view, _ = compact(body, window=26_000)
    items = view["input"]
    assert protocol_problems(items) == []
    placeholders = [
        i for i in items if i.get("type") == "function_call_output" and "handle=out_" in i["output"]
    ]
    assert placeholders
    by_call = {i["call_id"]: i for i in body["input"] if i.get("type") == "function_call_output"}
    for placeholder in placeholders:
        original = by_call[placeholder["call_id"]]
        assert {k: v for k, v in placeholder.items() if k != "output"} == {
            k: v for k, v in original.items() if k != "output"
        }
    assert not any(i.get("type") == "message" and "State ledger" in json.dumps(i) for i in items)


def _streamed(rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """What the client receives for ``rounds`` of output items (the last round finishes)."""
    sent: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            sent.append(message["body"])

    async def run() -> None:
        writer = ResponseWriter(send)
        writer.start(200, [], streaming=True)
        usage = {"input_tokens": 10, "output_tokens": 1, "total_tokens": 11}
        for index, items in enumerate(rounds):
            codec = DIALECT.codec(writer)
            for raw in round_events(items, usage):
                await codec.take(raw)
            if index == len(rounds) - 1:
                await codec.finish(usage)

    asyncio.run(run())
    return decode(b"".join(sent))


def _text_item(item_id: str, text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }


def test_a_read_rounds_long_text_streams_and_a_final_rounds_short_text_keeps_its_place() -> None:
    """A read round's text longer than what is held has reached the client before the read;
    a short text of the last round is sent at its end, between its reasoning and its call."""
    read = {
        "type": "function_call",
        "id": "fc_r",
        "call_id": "c_r",
        "name": "read_tool_output",
        "arguments": "{}",
    }
    reasoning = {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "E2"}
    call = {
        "type": "function_call",
        "id": "fc_2",
        "call_id": "c_2",
        "name": "exec_command",
        "arguments": "{}",
    }
    long_text = "Checking every saved output of the failing test first. " * 10
    events = _streamed(
        [[_text_item("msg_long", long_text), read], [reasoning, _text_item("msg_2", "Ok."), call]]
    )
    completed = events[-1]["response"]
    assert [i["id"] for i in completed["output"]] == ["msg_long", "rs_2", "msg_2", "fc_2"]
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == long_text + "Ok."
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
