"""The loop driver through the Gemini door and Code Assist's: a read round answered from the
store, then the final answer with usage summed, JSON and streamed, the answers in Google's wire
shapes (``tests/gemini_upstream/wire.py``). The round goes back whole (the read call keeps its
thought signature on its part, thoughts stay with their round) with one function response per
call, and the client sees only the last round, as one response."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.dialects import make_dialects
from proxy.dialects.doors import Target
from proxy.dialects.gemini_stream import merged_parts
from proxy.wire.errors import google_error_body
from tests.gemini_protocol import problems
from tests.gemini_upstream import wire
from tests.proxy.data_plane.harness import HANDLE, Run, drive, json_reply, sse_reply
from tests.proxy.data_plane.test_doors import check_result

MODEL = "gemini-3.8-flash"
FINAL = "The build failed because a test timed out."
THOUGHT = {"text": "The saved log will say why.", "thought": True}
READ = {
    "functionCall": {"id": "read_1", "name": "read_tool_output", "args": {"handle": HANDLE, "num_lines": 3}},
    "thoughtSignature": "ZmFrZXNpZ19yZWFkXzE=",
}
PREAMBLE = {"text": "Reading the saved log first."}
ANSWER = {"text": FINAL, "thoughtSignature": "ZmFrZXNpZ19maW5hbA=="}


def dialect(stream: bool, code_assist: bool = False) -> Any:
    if code_assist:
        return make_dialects()["code_assist"].at(Target(stream=stream))
    return make_dialects()["gemini"].at(Target(model=MODEL, stream=stream))


def request(stream: bool, code_assist: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "contents": [{"role": "user", "parts": [{"text": f"Why did the build fail? handle={HANDLE}"}]}],
        "systemInstruction": {"role": "user", "parts": [{"text": "You are a coding agent."}]},
        "tools": [
            {
                "functionDeclarations": [
                    {
                        "name": "run_shell_command",
                        "description": "Run a command.",
                        "parametersJsonSchema": {
                            "type": "object",
                            "properties": {"command": {"type": "string"}},
                        },
                    }
                ]
            }
        ],
        "generationConfig": {"temperature": 1, "thinkingConfig": {"includeThoughts": True}},
    }
    if code_assist:
        body = {"model": "gemini-2.5-pro", "project": "p-1", "user_prompt_id": "u-1", "request": body}
    return dialect(stream, code_assist).with_read_tool(body, 1000)


def rounds(stream: bool, code_assist: bool = False) -> list[Any]:
    envelope = "response" if code_assist else None
    answers = [
        ([THOUGHT, PREAMBLE, READ], wire.usage(120, 15, thoughts=6), "r-1"),
        ([ANSWER], wire.usage(400, 9), "r-2"),
    ]
    if stream:
        return [sse_reply(wire.events(parts, use, MODEL, rid, envelope)) for parts, use, rid in answers]
    made = [wire.response(parts, use, MODEL, rid) for parts, use, rid in answers]
    return [json_reply({"response": m} if code_assist else m) for m in made]


def check_rounds(run: Run, stream: bool, code_assist: bool = False) -> str:
    first, second = run.upstream.bodies
    assert first == request(stream, code_assist)
    if code_assist:
        assert {k: v for k, v in second.items() if k != "request"} == {
            k: v for k, v in first.items() if k != "request"
        }
        first, second = first["request"], second["request"]
    assert problems(second) == []
    *before, model, user = second["contents"]
    assert before == first["contents"]
    # The round goes back whole, as the API wrote it: the call's signature on its own part.
    assert model == {"role": "model", "parts": [THOUGHT, PREAMBLE, READ]}
    (part,) = user["parts"]
    assert user["role"] == "user" and part["functionResponse"]["id"] == "read_1"
    assert part["functionResponse"]["name"] == "read_tool_output"
    text: str = part["functionResponse"]["response"]["output"]
    return text


SUMMED = {
    "promptTokenCount": 400,
    "candidatesTokenCount": 24,
    "thoughtsTokenCount": 6,
    "totalTokenCount": 430,
}


@pytest.mark.parametrize("code_assist", [False, True])
async def test_a_json_read_round_then_the_answer(code_assist: bool) -> None:
    run = await drive(
        dialect(False, code_assist),
        request(False, code_assist),
        rounds(False, code_assist),
        error_body=google_error_body,
    )
    read = check_rounds(run, False, code_assist)
    answer = run.client.json()
    if code_assist:
        answer = answer["response"]
    assert run.client.status == 200 and answer["responseId"] == "r-2"
    assert answer["candidates"][0]["content"]["parts"] == [ANSWER]
    assert answer["usageMetadata"] == {**wire.usage(400, 9), **SUMMED}
    check_result(run, read, [ANSWER])


@pytest.mark.parametrize("code_assist", [False, True])
async def test_a_streamed_read_round_then_the_answer(code_assist: bool) -> None:
    run = await drive(
        dialect(True, code_assist),
        request(True, code_assist),
        rounds(True, code_assist),
        error_body=google_error_body,
    )
    read = check_rounds(run, True, code_assist)
    client = run.client
    assert client.status == 200 and client.complete
    events = [e["response"] if code_assist else e for e in client.events()]
    text = "".join(p["text"] for e in events for p in e["candidates"][0]["content"]["parts"])
    assert text == FINAL
    assert [e["candidates"][0].get("finishReason") for e in events][-1] == "STOP"
    assert sum(1 for e in events if "finishReason" in e["candidates"][0]) == 1
    assert events[-1]["usageMetadata"] == {**wire.usage(400, 9), **SUMMED}
    assert any(
        p.get("thoughtSignature") == ANSWER["thoughtSignature"]
        for e in events
        for p in e["candidates"][0]["content"]["parts"]
    )
    # The read round's thought, preamble and call never show.
    assert b"read_tool_output" not in client.body and b"Reading the saved log" not in client.body
    assert b"The saved log will say why" not in client.body
    # The answer as it streamed: its plain text pieces joined, the signed one apart.
    check_result(run, read, merged_parts([p for chunk in wire.stream_parts([ANSWER]) for p in chunk]))


async def test_an_error_event_mid_stream_is_relayed_and_ends_the_stream() -> None:
    first = rounds(True)[0]
    broken = [
        *wire.events([ANSWER], wire.usage(400, 9), MODEL, "r-2")[:1],
        wire.event(wire.error_body(503, "Overloaded.")),
    ]
    run = await drive(dialect(True), request(True), [first, sse_reply(broken)], error_body=google_error_body)
    assert run.client.status == 200 and run.client.complete
    assert run.client.events()[-1] == wire.error_body(503, "Overloaded.")
    assert run.result.error == "upstream_error"


async def test_a_refused_first_round_is_the_apis_own_answer() -> None:
    refusal = wire.too_many_tokens(9000, 8192)
    run = await drive(
        dialect(True), request(True), [json_reply(refusal, status=400)], error_body=google_error_body
    )
    assert run.client.status == 400 and run.client.json() == refusal
