"""read_tool_output end to end: the real proxy with policy `improved` and its SQLite store, a
scripted upstream that reads a handle it saw in its request, and the official openai SDK."""

from __future__ import annotations

import re
from typing import Any

import openai
import orjson
import pytest

from tests.fake_upstream import FakeUpstream, Recorded, Reply, chunk, completion

pytestmark = pytest.mark.e2e

KEY_A = "sk-tenant-a-000000000000000000"
KEY_B = "sk-tenant-b-000000000000000000"
CONFIG = {"policy": "improved", "context_windows": {"default": 8192}, "read_tool": {"max_rounds": 3}}
HANDLE = re.compile(r"handle=(out_[0-9a-f]+)")


def history(marker: str = "ALPHA") -> list[Any]:
    messages: list[Any] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"Fix the bug ({marker})."},
    ]
    for i in range(6):
        lines = [f"{marker} line {n} of output {i}" for n in range(300)]
        if i == 0:
            lines[137] = f"SECRET-LINE-42 {marker}: value=1234"
        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{i}",
                        "type": "function",
                        "function": {
                            "name": "execute_bash",
                            "arguments": orjson.dumps({"command": f"run {i}"}).decode(),
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"c{i}", "name": "execute_bash", "content": "\n".join(lines)},
        ]
    return messages


def read_call(arguments: dict[str, Any], call_id: str = "r1") -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "read_tool_output", "arguments": orjson.dumps(arguments).decode()},
    }


def agent_call() -> dict[str, Any]:
    return {
        "id": "a1",
        "type": "function",
        "function": {"name": "execute_bash", "arguments": '{"command": "ls"}'},
    }


def handles_in(request: Recorded) -> list[str]:
    return HANDLE.findall(request.body.decode())


def read_first_handle(**arguments: Any) -> Reply:
    def decide(request: Recorded) -> Reply:
        handle = handles_in(request)[0]
        return Reply(body=completion(tool_calls=[read_call({"handle": handle, **arguments})]))

    return Reply(dynamic=decide)


def last_tool_result(request: Recorded) -> str:
    message = request.json()["messages"][-1]
    assert message["role"] == "tool"
    content: str = message["content"]
    return content


def client(proxy: Any, key: str = KEY_A) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key=key, max_retries=0)


def test_non_stream_read_by_pattern_is_answered_inside_the_proxy(
    start_proxy: Any, upstream: FakeUpstream
) -> None:
    proxy = start_proxy(CONFIG)
    upstream.queue(read_first_handle(pattern="SECRET-LINE"), Reply(body=completion("found it: value=1234")))
    answer = client(proxy).chat.completions.with_raw_response.create(model="m", messages=history())
    parsed = answer.parse()
    assert parsed.choices[0].message.content == "found it: value=1234"
    assert parsed.choices[0].message.tool_calls is None
    # The last round's prompt (the context of the answer), both rounds' completions.
    assert parsed.usage is not None and parsed.usage.prompt_tokens == 10
    assert parsed.usage.completion_tokens == 4 and parsed.usage.total_tokens == 14
    assert answer.headers["x-compaction-read-rounds"] == "1"
    first, second = upstream.requests
    assert [t["function"]["name"] for t in first.json()["tools"]] == ["read_tool_output"]
    result = last_tool_result(second)
    assert "SECRET-LINE-42 ALPHA: value=1234" in result and "138|" in result


def test_paging_unknown_handle_and_round_limit(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy(CONFIG)
    upstream.queue(
        read_first_handle(start_line=290, num_lines=5),
        Reply(body=completion(tool_calls=[read_call({"handle": "out_0000000000000000"})])),
        read_first_handle(start_line=1, num_lines=2),
        Reply(body=completion("final")),
    )
    answer = client(proxy).chat.completions.create(model="m", messages=history())
    assert answer.choices[0].message.content == "final"
    requests = upstream.requests
    assert len(requests) == 4
    assert "lines 290-294 of 300" in last_tool_result(requests[1])
    assert "no saved output with handle 'out_0000000000000000'" in last_tool_result(requests[2])
    # The last allowed round goes without the read tool (the agent's own tools stay usable).
    assert [t["function"]["name"] for t in requests[2].json()["tools"]] == ["read_tool_output"]
    assert "tools" not in requests[3].json() and "tool_choice" not in requests[3].json()


def test_mixed_internal_and_agent_calls(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy(CONFIG)

    def mixed(request: Recorded) -> Reply:
        calls = [read_call({"handle": handles_in(request)[0], "pattern": "SECRET"}), agent_call()]
        return Reply(body=completion(tool_calls=calls))

    upstream.queue(Reply(dynamic=mixed), Reply(body=completion(tool_calls=[agent_call()])))
    answer = client(proxy).chat.completions.create(model="m", messages=history())
    calls = answer.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == ["execute_bash"]  # type: ignore[union-attr]
    follow_up = upstream.requests[1].json()["messages"]
    assert [c["function"]["name"] for c in follow_up[-2]["tool_calls"]] == ["read_tool_output"]


def test_stream_with_tool_loop_is_one_well_formed_stream(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy(CONFIG)

    def stream_read(request: Recorded) -> Reply:
        handle = handles_in(request)[0]
        arguments = orjson.dumps({"handle": handle, "pattern": "SECRET"}).decode()
        parts = [
            chunk("", role=True),
            chunk("Let me check. "),
            {
                **chunk(None),
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "tool_calls": [
                                {
                                    "index": 0,
                                    "id": "r1",
                                    "type": "function",
                                    "function": {"name": "read_tool_output", "arguments": ""},
                                }
                            ]
                        },
                        "finish_reason": None,
                    }
                ],
            },
            {
                **chunk(None),
                "choices": [
                    {
                        "index": 0,
                        "delta": {"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]},
                        "finish_reason": None,
                    }
                ],
            },
            chunk(None, finish="tool_calls"),
        ]
        return Reply(kind="sse", chunks=parts)

    upstream.queue(
        Reply(dynamic=stream_read),
        Reply(
            kind="sse",
            chunks=[chunk("", role=True), chunk("value="), chunk("1234"), chunk(None, finish="stop")],
        ),
    )
    stream = client(proxy).chat.completions.create(model="m", messages=history(), stream=True)
    text, calls, finishes = "", 0, []
    for part in stream:
        for choice in part.choices:
            text += choice.delta.content or ""
            calls += len(choice.delta.tool_calls or [])
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
    # The read round's short preamble is held back and dropped (as it is without streaming).
    assert text == "value=1234"
    assert calls == 0 and finishes == ["stop"]
    assert "SECRET-LINE-42" in last_tool_result(upstream.requests[1])


def test_another_tenants_handle_is_not_found(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy(CONFIG)
    upstream.queue(Reply(body=completion("a done")))
    client(proxy, KEY_A).chat.completions.create(model="m", messages=history("ALPHA"))
    handle_of_a = handles_in(upstream.requests[-1])[0]

    def read_a(request: Recorded) -> Reply:
        assert handle_of_a not in handles_in(request)
        return Reply(body=completion(tool_calls=[read_call({"handle": handle_of_a})]))

    upstream.queue(Reply(dynamic=read_a), Reply(body=completion("b done")))
    client(proxy, KEY_B).chat.completions.create(model="m", messages=history("BRAVO"))
    assert "no saved output" in last_tool_result(upstream.requests[-1])


def test_handles_survive_a_restart(start_proxy: Any, upstream: FakeUpstream, tmp_path: Any) -> None:
    state = tmp_path / "shared-state"
    first = start_proxy(CONFIG, state_dir=state)
    upstream.queue(Reply(body=completion("ok")))
    client(first).chat.completions.create(
        model="m", messages=history(), extra_headers={"x-session-id": "run-7"}
    )
    sent_before = upstream.requests[-1].json()["messages"]
    first.stop()
    second = start_proxy(CONFIG, state_dir=state)
    upstream.queue(read_first_handle(pattern="SECRET"), Reply(body=completion("still there")))
    longer = [
        *history(),
        {"role": "assistant", "content": "Thinking."},
        {"role": "user", "content": "Go on."},
    ]
    answer = client(second).chat.completions.create(
        model="m", messages=longer, extra_headers={"x-session-id": "run-7"}
    )
    assert answer.choices[0].message.content == "still there"
    assert "SECRET-LINE-42 ALPHA: value=1234" in last_tool_result(upstream.requests[-1])
    # The restarted proxy continued the session from its stored checkpoint: same prefix.
    assert upstream.requests[-2].json()["messages"][: len(sent_before)] == sent_before
