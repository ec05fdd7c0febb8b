"""Shape-level junk on the Responses and Messages doors, as ``test_fuzz_shapes`` does for chat:
wrong types at any depth of any item or content block of a compaction-sized history (nulls,
numbers, lists where ids are, a ``tool_result`` nested hundreds deep), every policy, request by
request in one session, in process through the real app. Never a 500: what an adapter cannot
read goes upstream as the client sent it."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.app import create_app
from proxy.config.settings import Settings, load_settings, policy_specs
from proxy.state.sqlite_store import SQLiteStore

POLICIES = sorted(policy_specs(Settings()))
WINDOW = 4096


def _output(step: int) -> str:
    return "\n".join(f"tests/test_{step}.py::t{n} FAILED" for n in range(60)) + "\nValueError: bad"


def responses_history() -> list[Any]:
    items: list[Any] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the test."}]},
    ]
    for i in range(12):
        items += [
            {"type": "reasoning", "id": f"rs_{i}", "summary": [], "encrypted_content": f"enc-{i}"},
            *([{"type": "item_reference", "id": f"msg_{i}"}] if i % 3 == 0 else []),
            {
                "type": "function_call",
                "id": f"fc_{i}",
                "call_id": f"call_{i}",
                "name": "exec_command",
                "arguments": orjson.dumps({"cmd": f"pytest -k t{i}"}).decode(),
            },
            {"type": "function_call_output", "call_id": f"call_{i}", "output": _output(i)},
        ]
    return items


def messages_history() -> list[Any]:
    messages: list[Any] = [{"role": "user", "content": [{"type": "text", "text": "Fix the test."}]}]
    for i in range(12):
        messages += [
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": f"step {i}", "signature": f"sig-{i}"},
                    {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": {"command": f"t{i}"}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": _output(i)}],
            },
        ]
    return messages


def _deep(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = [{"type": "text", "text": "x", "content": value}]
    return value


JUNK = st.one_of(
    st.none(),
    st.integers(-5, 5),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.just({"type": 5}),
    st.just({"type": "text", "text": 7}),
    st.just(["call_1", "call_2"]),
    st.just(_deep(300)),
)


@st.composite
def mutated(draw: st.DrawFn, history: Any) -> list[Any]:
    """``history()`` with one value somewhere inside one entry replaced by junk (or deleted),
    the place chosen by walking down the entry's own keys and indices."""
    entries = copy.deepcopy(history())
    index = draw(st.integers(0, len(entries) - 1))
    parent: Any = entries
    key: Any = index
    while True:
        node = parent[key]
        children = (
            list(node) if isinstance(node, dict) else list(range(len(node))) if isinstance(node, list) else []
        )
        if not children or draw(st.booleans()):
            break
        parent, key = node, draw(st.sampled_from(children))
    if isinstance(parent, dict) and draw(st.integers(0, 5)) == 0:
        del parent[key]
    else:
        parent[key] = draw(JUNK)
    return entries


DOORS = {
    "responses": ("/v1/responses", "input", responses_history),
    "messages": ("/v1/messages", "messages", messages_history),
}


def answer(request: httpx.Request) -> httpx.Response:
    if request.url.path.endswith("/messages"):
        body: dict[str, Any] = {
            "id": "msg_x",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-6",
            "content": [{"type": "text", "text": "ok"}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 10, "output_tokens": 1},
        }
    else:
        message = {"type": "message", "id": "msg_o", "role": "assistant", "status": "completed"}
        message["content"] = [{"type": "output_text", "text": "ok", "annotations": []}]
        body = {"id": "resp_x", "object": "response", "status": "completed", "output": [message]}
        body["usage"] = {"input_tokens": 10, "output_tokens": 1, "total_tokens": 11}
    return httpx.Response(200, json=body)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.AsyncClient]:
    state = tmp_path_factory.mktemp("doors")
    app = create_app(
        load_settings(
            env={},
            overrides={
                "upstream.base_url": "http://upstream.test/v1",
                "anthropic.base_url": "http://upstream.test",
                "state_dir": str(state),
                "context_windows": {"default": WINDOW},
            },
        ),
        transport=httpx.MockTransport(answer),
        store=SQLiteStore(Path(state) / "c.db"),
    )
    yield httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost")


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), door=st.sampled_from(sorted(DOORS)), policy=st.sampled_from(POLICIES))
def test_junk_on_the_responses_and_messages_doors_never_gets_a_500(
    client: httpx.AsyncClient, data: st.DataObject, door: str, policy: str
) -> None:
    path, field, history = DOORS[door]
    entries = data.draw(mutated(history))
    session = data.draw(st.integers(0, 10**9))

    async def run() -> None:
        for end in (len(entries) - 6, len(entries) - 3, len(entries)):
            body = {"model": "claude-sonnet-4-6" if door == "messages" else "gpt-5", field: entries[:end]}
            if door == "messages":
                body["max_tokens"] = 256
            response = await client.post(
                path,
                content=json.dumps(body).encode(),  # orjson refuses the deepest junk
                headers={
                    "content-type": "application/json",
                    "x-compaction-policy": policy,
                    "x-session-id": f"s{session}",
                    "authorization": "Bearer k",
                    "x-api-key": "k",
                },
            )
            assert response.status_code != 500, response.text

    asyncio.run(run())
