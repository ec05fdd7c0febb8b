"""The loop driver through the Responses and Anthropic Messages doors (the Chat Completions door
is ``test_driver.py``): a read round answered from the store, then the final answer with usage
summed, JSON and streamed, the answers in each provider's wire shapes
(``tests/responses_upstream/wire.py``, ``tests/anthropic_upstream/wire.py``). The round goes back
whole (reasoning and thinking stay with the items of their turn) and the client sees only the
last round, numbered as one response."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.dialects import make_dialects
from proxy.wire.errors import anthropic_error_body
from tests.anthropic_upstream import wire as anthropic_wire
from tests.proxy.data_plane.harness import HANDLE, Run, drive, json_reply, sse_reply
from tests.responses_upstream import wire as responses_wire

DIALECTS = make_dialects()
RESPONSES, ANTHROPIC = DIALECTS["responses"], DIALECTS["anthropic"]
FINAL = "The build failed because a test timed out."
ARGUMENTS = {"handle": HANDLE, "num_lines": 3}


def check_result(run: Run, read: str, final_answer: list[Any]) -> None:
    assert "log line 1: ok" in read and "log line 3: ok" in read and "log line 4: ok" not in read
    assert run.store.gets == [HANDLE]
    result = run.result
    assert (result.rounds, result.reads, result.status, result.error) == (1, ["ok"], 200, None)
    assert result.final_answer == final_answer
    sizes = [run.loop.dialect.count(body, run.loop.counter) for body in run.upstream.bodies]
    assert result.round_tokens == sizes
    headers = run.client.headers
    assert headers[b"x-compaction-read-rounds"] == b"1"
    assert headers[b"x-compaction-tokens-after"] == str(max(sizes)).encode()


# --- the Responses API ----------------------------------------------------------------------

MODEL = "gpt-5-codex"
REASONING = {
    "id": "rs_01",
    "type": "reasoning",
    "summary": [{"type": "summary_text", "text": "The saved log will say why."}],
    "encrypted_content": "gAAAAABo-opaque-reasoning==",
}
READ_ITEM = {
    "id": "fc_01",
    "type": "function_call",
    "status": "completed",
    "arguments": orjson.dumps(ARGUMENTS).decode(),
    "call_id": "call_read_01",
    "name": "read_tool_output",
}
MESSAGE = {
    "id": "msg_01",
    "type": "message",
    "status": "completed",
    "role": "assistant",
    "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": FINAL}],
}


def responses_body(stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "instructions": "You are a coding agent.",
        "input": [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": f"Why did the build fail? handle={HANDLE}"}],
            }
        ],
        "tools": [
            {
                "type": "function",
                "name": "shell",
                "description": "Run a command.",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
                "strict": False,
            }
        ],
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
    }
    if stream:
        body["stream"] = True
    return RESPONSES.with_read_tool(body, 1000)


def responses_usage(prompt: int, output: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + output,
    }


def responses_rounds(stream: bool) -> list[Any]:
    body = responses_body(stream)
    rounds: list[tuple[str, list[dict[str, Any]], dict[str, Any]]] = [
        ("resp_01", [REASONING, READ_ITEM], responses_usage(120, 15)),
        ("resp_02", [MESSAGE], responses_usage(400, 9)),
    ]
    if stream:
        return [sse_reply(responses_wire.events(MODEL, rid, body, out, use)) for rid, out, use in rounds]
    return [
        json_reply(responses_wire.response(MODEL, rid, body, out, use, "completed"))
        for rid, out, use in rounds
    ]


def check_responses_rounds(run: Run, stream: bool) -> str:
    first, second = run.upstream.bodies
    assert first == responses_body(stream)
    *before, reasoning, call, output = second["input"]
    assert before == first["input"]
    assert (reasoning, call) == (REASONING, READ_ITEM)  # encrypted_content byte for byte
    assert output["type"] == "function_call_output" and output["call_id"] == "call_read_01"
    text: str = output["output"]
    return text


SUMMED = {**responses_usage(400, 9), "output_tokens": 24, "total_tokens": 424}


async def test_a_responses_json_read_round_then_the_answer() -> None:
    run = await drive(RESPONSES, responses_body(False), responses_rounds(False))
    read = check_responses_rounds(run, stream=False)
    answer = run.client.json()
    assert run.client.status == 200 and answer["id"] == "resp_02"
    assert answer["output"] == [MESSAGE]
    assert answer["usage"] == SUMMED
    check_result(run, read, [MESSAGE])


async def test_a_responses_streamed_read_round_then_the_answer() -> None:
    run = await drive(RESPONSES, responses_body(True), responses_rounds(True))
    read = check_responses_rounds(run, stream=True)
    client = run.client
    assert client.status == 200 and client.complete
    events = client.events()
    kinds = [e["type"] for e in events]
    # One response for the client: created once, the last round's message, completed once.
    assert kinds[0] == "response.created" and kinds.count("response.created") == 1
    assert kinds[-1] == "response.completed" and kinds.count("response.completed") == 1
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    completed = events[-1]["response"]
    assert completed["output"] == [MESSAGE] and completed["usage"] == SUMMED
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == FINAL
    assert all(e.get("output_index", 0) == 0 for e in events)
    # The read round's reasoning and call never show (the echoed ``tools`` do name the tool).
    assert b"call_read_01" not in client.body and b"rs_01" not in client.body
    check_result(run, read, [MESSAGE])


# --- Anthropic Messages ---------------------------------------------------------------------

CLAUDE = "claude-sonnet-4-5-20250929"
PREAMBLE = {"type": "text", "text": "I'll read the saved log first."}
TOOL_USE = {"type": "tool_use", "id": "toolu_01", "name": "read_tool_output", "input": ARGUMENTS}
ANSWER = {"type": "text", "text": FINAL}


def anthropic_body(stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": CLAUDE,
        "max_tokens": 4096,
        "system": [{"type": "text", "text": "You are a coding agent."}],
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": f"Why did the build fail? handle={HANDLE}"}],
            }
        ],
        "tools": [
            {
                "name": "Bash",
                "description": "Run a command.",
                "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
            }
        ],
    }
    if stream:
        body["stream"] = True
    return ANTHROPIC.with_read_tool(body, 1000)


def anthropic_rounds(stream: bool) -> list[Any]:
    rounds: list[tuple[str, list[dict[str, Any]], dict[str, Any]]] = [
        ("msg_01", [PREAMBLE, TOOL_USE], anthropic_wire.usage(120, 0, 0, 15)),
        ("msg_02", [ANSWER], anthropic_wire.usage(400, 0, 0, 9)),
    ]
    if stream:
        return [sse_reply(anthropic_wire.events(mid, CLAUDE, content, use)) for mid, content, use in rounds]
    return [json_reply(anthropic_wire.message(mid, CLAUDE, content, use)) for mid, content, use in rounds]


def check_anthropic_rounds(run: Run, stream: bool) -> str:
    first, second = run.upstream.bodies
    assert first == anthropic_body(stream)
    *before, assistant, results = second["messages"]
    assert before == first["messages"]
    assert assistant == {"role": "assistant", "content": [PREAMBLE, TOOL_USE]}
    (result,) = results["content"]
    assert results["role"] == "user" and result["type"] == "tool_result"
    assert result["tool_use_id"] == "toolu_01"
    text: str = result["content"]
    return text


CLAUDE_SUMMED = {
    "input_tokens": 400,
    "cache_creation_input_tokens": 0,
    "cache_read_input_tokens": 0,
    "output_tokens": 24,
}


async def test_an_anthropic_json_read_round_then_the_answer() -> None:
    run = await drive(
        ANTHROPIC, anthropic_body(False), anthropic_rounds(False), error_body=anthropic_error_body
    )
    read = check_anthropic_rounds(run, stream=False)
    answer = run.client.json()
    assert run.client.status == 200 and answer["id"] == "msg_02"
    assert answer["content"] == [ANSWER] and answer["stop_reason"] == "end_turn"
    assert answer["usage"] == {**anthropic_wire.usage(400, 0, 0, 9), **CLAUDE_SUMMED}
    check_result(run, read, [ANSWER])


@pytest.mark.parametrize("crlf", [False, True])
async def test_an_anthropic_streamed_read_round_then_the_answer(crlf: bool) -> None:
    rounds = anthropic_rounds(True)
    if crlf:
        rounds = [sse_reply([b"".join(r.chunks)], crlf=True) for r in rounds]
    run = await drive(ANTHROPIC, anthropic_body(True), rounds, error_body=anthropic_error_body)
    read = check_anthropic_rounds(run, stream=True)
    client = run.client
    assert client.status == 200 and client.complete
    events = client.events()
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds.count("message_start") == 1
    assert kinds[-2:] == ["message_delta", "message_stop"]
    blocks = [e for e in events if e["type"] == "content_block_start"]
    assert [b["index"] for b in blocks] == [0] and blocks[0]["content_block"]["type"] == "text"
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert text == FINAL
    delta = events[-2]
    assert delta["delta"]["stop_reason"] == "end_turn" and delta["usage"] == CLAUDE_SUMMED
    assert b"read_tool_output" not in client.body and b"I'll read the saved log" not in client.body
    check_result(run, read, [ANSWER])


async def test_an_anthropic_stream_whose_last_event_has_no_blank_line_still_ends_well() -> None:
    first, final = anthropic_rounds(True)
    raw = b"".join(final.chunks or [])
    assert raw.endswith(b"\n\n")
    run = await drive(
        ANTHROPIC,
        anthropic_body(True),
        [first, sse_reply([raw[:-2]])],  # the stream closes right after message_stop's data line
        error_body=anthropic_error_body,
    )
    assert run.client.complete and run.client.events()[-1] == {"type": "message_stop"}
    assert run.result.error is None and run.result.final_answer == [ANSWER]


async def test_an_anthropic_error_event_mid_stream_is_relayed_and_ends_the_stream() -> None:
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    first = anthropic_rounds(True)[0]
    events = anthropic_wire.events("msg_02", CLAUDE, [ANSWER], anthropic_wire.usage(400, 0, 0, 9))
    broken = [*events[:5], anthropic_wire.error_event({"error": overloaded["error"]})]
    run = await drive(
        ANTHROPIC, anthropic_body(True), [first, sse_reply(broken)], error_body=anthropic_error_body
    )
    client = run.client
    assert client.status == 200 and client.complete
    assert client.events()[-1] == overloaded
    assert b"message_stop" not in client.body
    assert run.result.error == "upstream_error"
