"""The demo's stand-in model: it holds requests to its window with OpenAI's own 400, reports the
prompt tokens it counted, answers the script's tool calls from the request alone (however much
of the history a proxy left out), searches saved outputs when offered the read tool, and serves
all of it over loopback HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from policies.tokens import TokenCounter
from proxy.commands.demo import demo_config, proxy_environment
from proxy.commands.demo_session import FINAL_ANSWER, SCRIPT, SYSTEM_PROMPT, TASK, TOOLS
from proxy.commands.stand_in_model import (
    MODEL,
    READ_ARGUMENTS,
    READ_TOOL,
    StandInModel,
    StandInServer,
    last_step,
)

READ_TOOL_SCHEMA = {"type": "function", "function": {"name": READ_TOOL, "parameters": {"type": "object"}}}


def start() -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": TASK}]


def body(messages: list[dict[str, Any]], *, read_tool: bool = False, max_tokens: int = 256) -> dict[str, Any]:
    tools = [*TOOLS, READ_TOOL_SCHEMA] if read_tool else TOOLS
    return {"model": MODEL, "messages": messages, "tools": tools, "max_tokens": max_tokens}


def play(model: StandInModel, messages: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
    """One round: ask, append the answer and, for each call, the script's output."""
    status, answer = model.answer(body(messages, **options))
    assert status == 200, answer
    message = answer["choices"][0]["message"]
    messages.append(message)
    for call in message.get("tool_calls") or []:
        step = last_step([message])
        output = SCRIPT[step - 1].output if step else "Searched 3 saved output(s)"
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
    return answer


def test_a_request_over_the_window_gets_openais_context_length_error() -> None:
    model = StandInModel(window=2_000)
    messages = start()
    for _ in range(2):  # the second step prints about 2,000 tokens: past the window
        play(model, messages)
    request = body(messages, max_tokens=500)
    prompt = TokenCounter().count_request(request).total
    assert prompt + 500 > 2_000
    status, answer = model.answer(request)
    assert status == 400
    error = answer["error"]
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error",
        "messages",
        "context_length_exceeded",
    )
    assert error["message"] == (
        f"This model's maximum context length is 2000 tokens. However, you requested {prompt + 500} "
        f"tokens ({prompt} in the messages, 500 in the completion). Please reduce the length of the "
        "messages or completion."
    )
    assert model.seen[-1].kind == "rejected" and model.seen[-1].status == 400
    # The same history with a smaller answer reserve than the room left is answered.
    assert model.answer(body(messages[:3], max_tokens=10))[0] == 200


def test_it_answers_the_scripts_tool_calls_in_order_with_usage() -> None:
    model = StandInModel(window=100_000, script=SCRIPT[:3])
    messages = start()
    for number, step in enumerate(SCRIPT[:3], 1):
        answer = play(model, messages)
        choice = answer["choices"][0]
        call = choice["message"]["tool_calls"][0]
        assert choice["finish_reason"] == "tool_calls"
        assert call["id"] == f"call_step_{number:02d}"
        assert (call["function"]["name"], call["function"]["arguments"]) == (step.tool, step.arguments_json())
        assert choice["message"]["content"] == step.thought
        usage = answer["usage"]
        assert usage["prompt_tokens"] == model.seen[-1].prompt_tokens > 0
        assert usage["completion_tokens"] > 0
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    # The prompt tokens it reports are the proxy's own count (o200k, a model of unknown name).
    final = body(messages)
    assert model.answer(final)[1]["usage"]["prompt_tokens"] == TokenCounter().count_request(final).total
    done = model.seen[-1]
    assert (done.kind, done.step) == ("final", 3)
    status, answer = model.answer(final)
    assert status == 200 and answer["choices"][0] == {
        "index": 0,
        "message": {"role": "assistant", "content": FINAL_ANSWER},
        "finish_reason": "stop",
    }


def test_it_decides_from_the_request_alone_whatever_a_proxy_left_out() -> None:
    model = StandInModel(window=100_000)
    messages = start()
    for _ in range(5):
        play(model, messages)
    # A compacted view: the head, a summary, and only the newest step verbatim.
    view = [
        *start(),
        {"role": "user", "content": "[Summary of the earlier conversation] ..."},
        *messages[-2:],
    ]
    status, answer = StandInModel(window=100_000).answer(body(view))
    assert status == 200
    assert answer["choices"][0]["message"]["tool_calls"][0]["id"] == "call_step_06"


def test_it_searches_the_saved_outputs_when_offered_the_read_tool() -> None:
    model = StandInModel(window=100_000, script=SCRIPT[:4], read_after_step=2)
    messages = start()
    play(model, messages, read_tool=True)
    play(model, messages)  # step 2, not offered the tool: no read
    assert [s.kind for s in model.seen] == ["step", "step"]
    answer = play(model, messages, read_tool=True)
    call = answer["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == READ_TOOL
    assert orjson.loads(call["function"]["arguments"]) == READ_ARGUMENTS
    # The proxy answers the read and asks again: the model goes on with the script.
    answer = play(model, messages, read_tool=True)
    assert answer["choices"][0]["message"]["tool_calls"][0]["id"] == "call_step_03"
    assert [s.kind for s in model.seen] == ["step", "step", "read", "step"]
    assert len(model.reads) == 1
    assert model.reads[0].arguments == READ_ARGUMENTS
    assert model.reads[0].result == "Searched 3 saved output(s)"


@pytest.fixture
def server() -> Iterator[StandInServer]:
    running = StandInServer(StandInModel(window=3_000)).start()
    yield running
    running.stop()


def test_it_speaks_chat_completions_over_loopback(server: StandInServer) -> None:
    assert server.base_url.startswith("http://127.0.0.1:")
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        listed = client.get("/models").json()
        assert listed["data"][0]["id"] == MODEL
        answered = client.post("/chat/completions", json=body(start()))
        assert answered.status_code == 200 and answered.headers["content-type"] == "application/json"
        assert answered.json()["object"] == "chat.completion"
        assert answered.headers["x-request-id"].startswith("req_standin_")
        # Keep-alive: the second request reuses the connection.
        too_long = client.post("/chat/completions", json=body(start(), max_tokens=5_000))
        assert too_long.status_code == 400
        assert too_long.json()["error"]["code"] == "context_length_exceeded"
        assert client.post("/chat/completions", json={**body(start()), "stream": True}).status_code == 400
        assert client.post("/chat/completions", content=b"{").status_code == 400
        assert client.post("/embeddings", json={}).status_code == 404


def test_the_demos_proxy_reads_only_the_demos_configuration(tmp_path: Any) -> None:
    config = demo_config(tmp_path, "http://127.0.0.1:9/v1", 8123, 16_384)
    # A name the built-in models table does not know, given its window by the temporary file;
    # policy and mode are the built-in defaults.
    assert config["models"] == {MODEL: {"window": 16_384}}
    assert "policy" not in config and "mode" not in config
    assert config["upstream"]["base_url"] == "http://127.0.0.1:9/v1"
    assert config["anthropic"]["base_url"] == "http://127.0.0.1:9"
    env = proxy_environment(
        {
            "PATH": "/bin",
            "COMPACTION_PROXY_UPSTREAM_URL": "https://api.openai.com/v1",
            "COMPACTION_PROXY_CONFIG": "x",
        }
    )
    assert env == {"PATH": "/bin"}
