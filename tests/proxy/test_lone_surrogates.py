"""Bodies orjson refuses but RFC 8259 allows, as Node agents send them, through the real app on
each door, JSON and streamed: tool outputs cut by UTF-16 length through an emoji (a lone
surrogate escape, ``"\\ud83d"``) and integers beyond 64 bits are compacted like any other body;
the upstream receives valid JSON with each lone surrogate as its escape and each integer exact,
untouched items as the client sent them, and ``read_tool_output`` reads a saved output back with
its lone surrogate."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from proxy.app import create_app
from proxy.config.settings import load_settings
from proxy.state.sqlite_store import SQLiteStore
from tests.agent_upstream import wire as chat_wire
from tests.agent_upstream.script import Answer, Call
from tests.anthropic_upstream import wire as anthropic_wire
from tests.responses_upstream import wire as responses_wire

EMOJI = "\U0001f600"
BIG = 2**70 + 1  # beyond 64 bits
HANDLE = re.compile(rb"handle=(out_[0-9a-f]+)")
DOORS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "anthropic": "/v1/messages"}


def node_slice(text: str, units: int) -> str:
    """``text.slice(0, units)`` as JavaScript cuts it: by UTF-16 code units."""
    return text.encode("utf-16-le", "surrogatepass")[: 2 * units].decode("utf-16-le", "surrogatepass")


def output(step: int) -> str:
    """A tool output cut through an emoji, as an agent truncating by ``.length`` cuts it."""
    lines = [f"line {n} of step {step} {EMOJI}" for n in range(200)]
    lines[3] = node_slice(f"CUT-{step} {EMOJI}", len(f"CUT-{step} ") + 1)  # "CUT-3 \ud83d"
    return "\n".join(lines)


def history(door: str, steps: int = 8) -> list[Any]:
    items: list[Any] = []
    if door == "responses":
        items.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix."}]})
    else:
        items.append({"role": "user", "content": "Fix the tests."})
    for i in range(steps):
        call_id, text = f"call_{i}", output(i)
        if door == "chat":
            call = {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": '{"c":"t"}'}}
            items += [
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call_id, "content": text},
            ]
        elif door == "responses":
            items += [
                {"type": "function_call", "call_id": call_id, "name": "bash", "arguments": '{"c":"t"}'},
                {"type": "function_call_output", "call_id": call_id, "output": text},
            ]
        else:
            use = {"type": "tool_use", "id": call_id, "name": "Bash", "input": {"c": "t", "pid": BIG}}
            result = {"type": "tool_result", "tool_use_id": call_id, "content": text}
            items += [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]
    return items


def request(door: str, stream: bool) -> dict[str, Any]:
    field = "input" if door == "responses" else "messages"
    body: dict[str, Any] = {"model": "gpt-4o", field: history(door), "stream": stream, "seed": BIG}
    if door == "anthropic":
        body |= {"model": "claude-sonnet-4-5", "max_tokens": 512}
    return body


def _read_answer(door: str, handle: str, stream: bool, body: dict[str, Any]) -> httpx.Response:
    arguments = json.dumps({"handle": handle, "pattern": "CUT-"})
    if door == "chat":
        said = Answer(calls=[Call("call_read", "read_tool_output", arguments)])
        return _answer(door, stream, said, body)
    if door == "responses":
        item = {"id": "fc_r", "type": "function_call", "status": "completed", "arguments": arguments}
        item |= {"call_id": "call_read", "name": "read_tool_output"}
        return _answer(door, stream, [item], body)
    block = {
        "type": "tool_use",
        "id": "toolu_read",
        "name": "read_tool_output",
        "input": json.loads(arguments),
    }
    return _answer(door, stream, [block], body)


def _text_answer(door: str, stream: bool, body: dict[str, Any]) -> httpx.Response:
    if door == "chat":
        return _answer(door, stream, Answer(content="done"), body)
    if door == "responses":
        content = [{"type": "output_text", "text": "done", "annotations": [], "logprobs": []}]
        item = {
            "id": "msg_1",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": content,
        }
        return _answer(door, stream, [item], body)
    return _answer(door, stream, [{"type": "text", "text": "done"}], body)


def _answer(door: str, stream: bool, said: Any, body: dict[str, Any]) -> httpx.Response:
    sse = {"content-type": "text/event-stream"}
    if door == "chat":
        use = {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105}
        if stream:
            return httpx.Response(
                200, headers=sse, content=b"".join(chat_wire.chunks("gpt-4o", "c1", said, use))
            )
        return httpx.Response(200, json=chat_wire.completion("gpt-4o", "c1", said, use))
    if door == "responses":
        use = {"input_tokens": 100, "output_tokens": 5, "total_tokens": 105}
        if stream:
            events = responses_wire.events("gpt-4o", "resp_1", body, said, use)
            return httpx.Response(200, headers=sse, content=b"".join(events))
        return httpx.Response(
            200, json=responses_wire.response("gpt-4o", "resp_1", body, said, use, "completed")
        )
    use = anthropic_wire.usage(100, 0, 0, 5)
    if stream:
        events = anthropic_wire.events("msg_1", "claude-sonnet-4-5", said, use)
        return httpx.Response(200, headers=sse, content=b"".join(events))
    return httpx.Response(200, json=anthropic_wire.message("msg_1", "claude-sonnet-4-5", said, use))


class Upstream:
    """Reads the first saved output the proxy names, then answers; every body kept as sent."""

    def __init__(self, door: str) -> None:
        self.door = door
        self.bodies: list[bytes] = []

    def __call__(self, sent: httpx.Request) -> httpx.Response:
        if not sent.url.path.endswith(("/completions", "/responses", "/messages")):
            return httpx.Response(404)  # the proxy asking for the model's window
        body = json.loads(sent.content)  # the proxy's body is valid JSON
        self.bodies.append(sent.content)
        handles = HANDLE.findall(sent.content)
        if len(self.bodies) == 1 and handles:
            return _read_answer(self.door, handles[0].decode(), body.get("stream") is True, body)
        return _text_answer(self.door, body.get("stream") is True, body)


def app(tmp_path: Path, upstream: Upstream, **overrides: Any) -> httpx.AsyncClient:
    settings = load_settings(
        env={},
        overrides={
            "upstream.base_url": "http://upstream.test/v1",
            "anthropic.base_url": "http://upstream.test",
            "state_dir": str(tmp_path),
            "policy": "improved",
            "context_windows": {"default": 8192},
            **overrides,
        },
    )
    served = create_app(
        settings, transport=httpx.MockTransport(upstream), store=SQLiteStore(tmp_path / "c.db")
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=served), base_url="http://localhost")


def post(client: httpx.AsyncClient, door: str, content: bytes) -> httpx.Response:
    headers = {"content-type": "application/json", "authorization": "Bearer k", "x-api-key": "k"}
    return asyncio.run(client.post(DOORS[door], content=content, headers=headers))


def read_result(door: str, body: dict[str, Any]) -> str:
    """The text the proxy answered the read call with, in the last body it sent."""
    if door == "chat":
        return str(body["messages"][-1]["content"])
    if door == "responses":
        return str(body["input"][-1]["output"])
    (block,) = body["messages"][-1]["content"]
    content = block["content"]
    return content if isinstance(content, str) else "".join(part["text"] for part in content)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("door", sorted(DOORS))
def test_a_body_with_lone_surrogates_and_big_integers_is_compacted(
    tmp_path: Path, door: str, stream: bool
) -> None:
    upstream = Upstream(door)
    client_body = request(door, stream)
    content = json.dumps(client_body).encode()
    assert b"\\ud83d\\n" in content and str(BIG).encode() in content
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(content)
    answer = post(app(tmp_path, upstream), door, content)
    assert answer.status_code == 200, answer.text
    assert "x-compaction-skipped" not in answer.headers
    assert int(answer.headers["x-compaction-tokens-after"]) < int(
        answer.headers["x-compaction-tokens-before"]
    )
    assert answer.headers["x-compaction-read-rounds"] == "1"
    first, second = upstream.bodies
    for sent in (first, second):
        assert b"\xf4\x8f" not in sent  # no mark reaches the upstream
        assert sent.count(b"\\ud83d") >= 1 and f'"seed":{BIG}'.encode() in sent
    view = json.loads(first)
    field = "input" if door == "responses" else "messages"
    # The last step, untouched, goes as the client sent it: its lone surrogate, its integer.
    assert view[field][-2:] == client_body[field][-2:]
    read = read_result(door, json.loads(second))
    assert "CUT-0 \ud83d" in read


def test_a_large_body_with_lone_surrogates_is_compacted_in_a_worker_process(tmp_path: Path) -> None:
    upstream = Upstream("chat")
    client_body = request("chat", False)
    served = app(tmp_path, upstream, **{"server.large_request_messages": 10})
    answer = post(served, "chat", json.dumps(client_body).encode())
    assert answer.status_code == 200 and "x-compaction-skipped" not in answer.headers
    assert int(answer.headers["x-compaction-tokens-after"]) < int(
        answer.headers["x-compaction-tokens-before"]
    )
    first, second = upstream.bodies
    assert b"\xf4\x8f" not in first + second and f'"seed":{BIG}'.encode() in first
    assert json.loads(first)["messages"][-2:] == client_body["messages"][-2:]
    assert "CUT-0 \ud83d" in read_result("chat", json.loads(second))


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
            "NaN is not JSON",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "t": 1e999}',
            "a number out of a double's range",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "\\ud83d \xf4\x8f\xa0\x80"}]}',
            "lone surrogates beside private-use characters U+10F800-U+10FFFF",
        ),
    ],
    ids=["nan", "out-of-range", "marks-taken"],
)
def test_what_no_json_writer_gives_back_goes_as_sent(tmp_path: Path, content: bytes, why: str) -> None:
    upstream = Upstream("chat")
    answer = post(app(tmp_path, upstream), "chat", content)
    assert answer.status_code == 200
    assert answer.headers["x-compaction-skipped"] == why
    assert upstream.bodies == [content]
