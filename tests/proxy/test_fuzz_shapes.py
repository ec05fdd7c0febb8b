"""Shape-level junk inside otherwise valid, compaction-sized histories: wrong types in every
field of a message, of a tool call and of a content part, and null entries. Every policy,
request by request in one session (so checkpoints are re-applied to the junk), in process
through the real app, and the policies called directly. Never a 500, never an exception: a
malformed history goes upstream as the client sent it (the upstream's own error answers it)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.conversation import shape_problem
from policies.digests import Digests
from policies.pipeline import Checkpoint, build_policies
from policies.tokens import TokenCounter
from proxy.app import create_app
from proxy.config.settings import Settings, load_settings, policy_specs
from proxy.state.sqlite_store import SQLiteStore

POLICIES = sorted(policy_specs(Settings()))
BUILT = build_policies(policy_specs(Settings()))
COUNTER = TokenCounter()
WINDOW = 4096


def history() -> list[dict[str, Any]]:
    """A valid agent history well past 0.8 x the window: every request compacts."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": [{"type": "text", "text": "Fix the failing test."}]},
    ]
    for i in range(14):
        call_id = f"call_{i}"
        messages.append(
            {
                "role": "assistant",
                "content": "Next." if i % 3 else None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": "execute_bash",
                            "arguments": orjson.dumps({"command": f"pytest -k t{i}"}).decode(),
                        },
                    }
                ],
            }
        )
        output = (
            "\n".join(f"tests/test_{i}.py::t{n} FAILED" for n in range(60)) + "\nValueError: bad\n1 failed"
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "name": "execute_bash", "content": output})
    return messages


JUNK = st.one_of(
    st.none(),
    st.integers(-5, 5),
    st.booleans(),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.just({"type": 5}),
    st.just({"type": "text", "text": 7}),
)
# Where junk goes: a path of keys/indices from a message (empty: the message itself).
FIELDS = st.sampled_from(
    [
        (),
        ("role",),
        ("content",),
        ("content", 0),
        ("content", 0, "text"),
        ("content", 0, "type"),
        ("name",),
        ("tool_call_id",),
        ("tool_calls",),
        ("tool_calls", 0),
        ("tool_calls", 0, "id"),
        ("tool_calls", 0, "type"),
        ("tool_calls", 0, "function"),
        ("tool_calls", 0, "function", "name"),
        ("tool_calls", 0, "function", "arguments"),
    ]
)


@st.composite
def mutated(draw: st.DrawFn) -> tuple[list[Any], int]:
    """A history with junk in one field of one message, and where the mutation sits."""
    messages: list[Any] = history()
    index = draw(st.integers(1, len(messages) - 1))
    path = draw(FIELDS)
    value = draw(JUNK)
    if not path:
        messages[index] = value
        return messages, index
    messages[index] = copy.deepcopy(messages[index])
    node: Any = messages[index]
    for key in path[:-1]:
        child = (
            node.get(key)
            if isinstance(node, dict)
            else (node[key] if isinstance(node, list) and node else None)
        )
        if not isinstance(child, dict | list):
            node[path[0]] = value if len(path) == 1 else [value]
            return messages, index
        node = child
    if isinstance(node, dict):
        node[path[-1]] = value
    elif isinstance(node, list) and node:
        node[0] = value
    return messages, index


def requests_of(messages: list[Any]) -> Iterator[list[Any]]:
    """The growing requests of one session, the last one whole."""
    for end in (len(messages) - 8, len(messages) - 4, len(messages)):
        yield messages[:end]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.AsyncClient, list[Any]]]:
    state = tmp_path_factory.mktemp("shapes")
    received: list[Any] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        received.append(orjson.loads(request.content))
        return httpx.Response(
            200, json={"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}
        )

    app = create_app(
        load_settings(
            env={},
            overrides={
                "upstream.base_url": "http://upstream.test/v1",
                "state_dir": str(state),
                "context_windows": {"default": WINDOW},
            },
        ),
        transport=httpx.MockTransport(upstream),
        store=SQLiteStore(Path(state) / "c.db"),
    )
    loop = asyncio.new_event_loop()
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost")
    yield http, received
    loop.run_until_complete(http.aclose())
    loop.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=mutated(), policy=st.sampled_from(POLICIES), session=st.integers(0, 10**9))
def test_junk_in_a_compacting_history_never_breaks_the_proxy(
    client: tuple[httpx.AsyncClient, list[Any]], case: tuple[list[Any], int], policy: str, session: int
) -> None:
    http, received = client
    messages, _ = case

    async def run() -> None:
        for request in requests_of(messages):
            received.clear()
            response = await http.post(
                "/v1/chat/completions",
                json={"model": "gpt-4o", "messages": request},
                headers={
                    "x-compaction-policy": policy,
                    "x-session-id": f"s{session}",
                    "authorization": "Bearer k",
                },
            )
            assert response.status_code != 500, response.text
            if response.status_code == 200 and shape_problem(request):
                # Malformed: passed through unchanged, and the reason said.
                assert received[-1]["messages"] == request
                assert response.headers["x-compaction-skipped"]

    asyncio.run(run())


@settings(max_examples=300, deadline=None)
@given(case=mutated(), policy=st.sampled_from(POLICIES))
def test_policies_never_raise_on_junk_request_by_request(case: tuple[list[Any], int], policy: str) -> None:
    messages, _ = case
    digests = Digests()

    async def run() -> None:
        checkpoint: Checkpoint | None = None
        for request in requests_of(messages):
            outcome = await BUILT[policy].apply(
                {"model": "gpt-4o", "messages": request},
                COUNTER,
                window=WINDOW,
                checkpoint=checkpoint,
                digests=digests,
            )
            checkpoint = outcome.checkpoint
            outcome.problems()

    asyncio.run(run())


def test_the_shape_check_names_the_field() -> None:
    messages = history()
    messages[4] = {**messages[4], "tool_call_id": ["call_1"]}
    assert shape_problem(messages) == "messages[4].tool_call_id must be a string"
    messages = history()
    messages[2]["tool_calls"][0]["function"] = "execute_bash"
    assert shape_problem(messages) == "messages[2].tool_calls[0].function must be an object"
    assert shape_problem([*history(), None]) == "messages[30] must be an object"
    assert shape_problem(history()) is None
