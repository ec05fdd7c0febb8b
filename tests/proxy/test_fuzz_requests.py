"""Hypothesis fuzzes the request path in process: arbitrary JSON bodies and message shapes,
through every shipped policy, answered by a mocked upstream. Never a 500; a 200 always means
the upstream received a body it can parse."""

from __future__ import annotations

import asyncio
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
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=40)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
roles = st.sampled_from(
    ["system", "user", "assistant", "tool", "developer", "function", "weird"]
) | st.integers(-9, 9)
tool_call = st.fixed_dictionaries(
    {
        "id": st.sampled_from(["a", "b", "c"]) | st.integers(-9, 9),
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": st.text(max_size=10), "arguments": st.text(max_size=30) | json_values}
        ),
    }
)
message = st.fixed_dictionaries(
    {"role": roles},
    optional={
        "content": st.none()
        | st.text(max_size=3000)
        | st.lists(
            st.dictionaries(st.sampled_from(["type", "text", "image_url"]), json_values, max_size=3),
            max_size=3,
        )
        | json_values,
        "tool_calls": st.lists(tool_call, max_size=3) | json_values,
        "tool_call_id": st.sampled_from(["a", "b", "c"]) | json_values,
        "name": st.text(max_size=10) | json_values,
    },
)
bodies = st.fixed_dictionaries(
    {"messages": st.lists(message | json_values, max_size=30)},
    optional={
        "model": st.text(max_size=20) | json_values,
        "stream": st.booleans() | json_values,
        "tools": json_values,
    },
)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.AsyncClient, list[Any]]]:
    state = tmp_path_factory.mktemp("fuzz")
    received: list[Any] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        received.append(orjson.loads(request.content))  # must parse
        return httpx.Response(
            200, json={"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}
        )

    settings_ = load_settings(
        env={},
        overrides={
            "state_dir": str(state),
            "context_windows": {"default": 1024},
            "upstream.http_client": "httpx",
        },
    )
    app = create_app(
        settings_, transport=httpx.MockTransport(upstream), store=SQLiteStore(Path(state) / "c.db")
    )
    yield httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost"), received


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
)
@given(body=bodies, policy=st.sampled_from(POLICIES))
def test_fuzzed_chat_requests_never_get_a_500(
    client: tuple[httpx.AsyncClient, list[Any]], body: Any, policy: str
) -> None:
    http, received = client
    body = {**body, "stream": False}

    async def send() -> httpx.Response:
        return await http.post(
            "/v1/chat/completions", content=orjson.dumps(body), headers={"x-compaction-policy": policy}
        )

    count = len(received)
    response = asyncio.run(send())
    assert response.status_code < 500, response.text
    if response.status_code == 200:
        assert len(received) == count + 1
    else:
        assert response.json()["error"]["message"]
