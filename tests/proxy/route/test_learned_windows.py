"""A model's window from its provider: asked once from its metadata, learned from its refusal
(the refused request compacted to that window and sent again, the client never seeing the
error), kept across restarts per upstream and model, and never over a configured window."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from policies.tokens import TokenCounter
from proxy.app import create_app
from proxy.config.settings import load_settings
from tests.agent_upstream.protocol import refusal_body

MODEL = "local-coder"  # a name no pattern of the built-in table covers
WINDOW = 8192


def long_request(
    steps: int = 30, task: str = "Fix the failing test in tests/test_parser.py."
) -> dict[str, Any]:
    """An agent session of ~14k tokens: a task, then tool calls with large outputs."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": task},
    ]
    for step in range(steps):
        call = {
            "id": f"call_{step}",
            "type": "function",
            "function": {"name": "bash", "arguments": '{"cmd": "ls"}'},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        output = "\n".join(f"step {step} line {n}: src/module_{n}.py ok {n * step}" for n in range(40))
        messages.append({"role": "tool", "tool_call_id": f"call_{step}", "content": output})
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    return {"model": MODEL, "messages": messages, "tools": tools}


class Provider:
    """A local model server at an 8k window: it refuses longer requests in its own words and,
    with ``metadata``, says its window in ``/v1/models`` as vLLM does."""

    def __init__(self, flavor: str = "vllm", metadata: bool = False) -> None:
        self.flavor, self.metadata = flavor, metadata
        self.counter = TokenCounter()
        self.chats: list[tuple[int, int]] = []  # (prompt tokens, status)
        self.bodies: list[dict[str, Any]] = []
        self.asked: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET" or request.url.path.startswith("/api/") or request.url.path == "/props":
            self.asked.append(f"{request.method} {request.url.path}")
            entry: dict[str, Any] = {"id": MODEL, "object": "model"}
            if self.metadata and request.url.path == "/v1/models":
                entry["max_model_len"] = WINDOW
                return httpx.Response(200, json={"object": "list", "data": [entry]})
            return httpx.Response(404, json={"error": {"message": "Not Found"}})
        body = orjson.loads(request.content)
        self.bodies.append(body)
        tokens = self.counter.count_request(body).total
        if tokens > WINDOW:
            self.chats.append((tokens, 400))
            return httpx.Response(400, json=refusal_body(self.flavor, WINDOW, tokens))
        self.chats.append((tokens, 200))
        answer = {"role": "assistant", "content": "done"}
        return httpx.Response(
            200,
            json={
                "id": "c",
                "object": "chat.completion",
                "model": MODEL,
                "choices": [{"index": 0, "message": answer, "finish_reason": "stop"}],
            },
        )


def make_app(tmp_path: Path, provider: Provider, **overrides: Any) -> Any:
    settings = load_settings(
        env={},
        overrides={"upstream.base_url": "http://local.test/v1", "state_dir": str(tmp_path), **overrides},
    )
    return create_app(settings, transport=httpx.MockTransport(provider))


async def post(app: Any, body: dict[str, Any], **headers: str) -> httpx.Response:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as client:
        return await client.post("/v1/chat/completions", json=body, headers=headers)


async def events(app: Any) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as client:
        found: list[dict[str, Any]] = (await client.get("/v1/compaction/events")).json()["data"]
        return found


@pytest.mark.parametrize("flavor", ["openai", "vllm", "llamacpp", "ollama", "lmstudio"])
async def test_a_refused_request_is_compacted_to_the_window_it_named_and_sent_again(
    tmp_path: Path, flavor: str
) -> None:
    provider = Provider(flavor)
    app = make_app(tmp_path, provider)
    response = await post(app, long_request(), **{"X-Session-Id": "s1"})
    assert response.status_code == 200, response.text
    assert [status for _, status in provider.chats] == [400, 200]
    assert provider.chats[1][0] <= WINDOW * 0.75
    assert response.headers["x-compaction-window-learned"] == str(WINDOW)
    retried = [e for e in await events(app) if "context_retry" in e]
    assert retried and retried[0]["context_retry"]["window"] == WINDOW
    assert retried[0]["context_retry"]["window_before"] == 128_000
    learned = orjson.loads((tmp_path / "learned_windows.json").read_bytes())
    assert learned["http://local.test:80/v1"][MODEL]["window"] == WINDOW
    # The next request is compacted at once: one call, no refusal.
    assert (await post(app, long_request(31), **{"X-Session-Id": "s1"})).status_code == 200
    assert [status for _, status in provider.chats] == [400, 200, 200]


async def test_the_window_in_the_metadata_is_asked_once_and_used_before_any_refusal(tmp_path: Path) -> None:
    provider = Provider(metadata=True)
    app = make_app(tmp_path, provider)
    for steps in (30, 31, 32):
        assert (await post(app, long_request(steps))).status_code == 200
    assert provider.asked == ["GET /v1/models"]
    assert [status for _, status in provider.chats] == [200, 200, 200]


async def test_a_refused_view_that_names_saved_outputs_is_compacted_again(tmp_path: Path) -> None:
    """The first view already names a saved output (the newest `ls` made the one before it
    obsolete), so it goes through the read loop: its refusal is acted on there too, before
    anything reached the client."""
    provider = Provider("openai")
    app = make_app(tmp_path, provider)
    response = await post(app, long_request(), **{"X-Session-Id": "s1"})
    assert response.status_code == 200, response.text
    first_tools = [t["function"]["name"] for t in provider.bodies[0].get("tools", [])]
    assert "read_tool_output" in first_tools
    assert [status for _, status in provider.chats] == [400, 200]


async def test_a_learned_window_survives_a_restart_and_stays_with_its_upstream(tmp_path: Path) -> None:
    first = Provider()
    assert (await post(make_app(tmp_path, first), long_request())).status_code == 200
    again = Provider()
    assert (await post(make_app(tmp_path, again), long_request())).status_code == 200
    assert [status for _, status in again.chats] == [200]  # known at once
    assert again.asked == []  # not asked again: the window is known
    elsewhere = Provider()
    app = make_app(tmp_path, elsewhere, **{"upstream.base_url": "http://other.test/v1"})
    assert (await post(app, long_request(task="Another session."))).status_code == 200
    assert [status for _, status in elsewhere.chats] == [400, 200]  # another server: learned anew


async def test_a_configured_window_wins_over_what_the_provider_says(tmp_path: Path) -> None:
    provider = Provider(metadata=True)
    app = make_app(tmp_path, provider, models={MODEL: {"window": 32000}})
    response = await post(app, long_request())
    assert response.status_code == 400  # the configuration is wrong, and the client is told
    assert "maximum context length is 8192" in response.json()["error"]["message"]
    assert [status for _, status in provider.chats] == [400]
    assert provider.asked == []
    assert not (tmp_path / "learned_windows.json").exists()


async def test_shadow_mode_learns_the_window_but_sends_the_client_its_bytes(tmp_path: Path) -> None:
    provider = Provider()
    app = make_app(tmp_path, provider, mode="shadow")
    assert (await post(app, long_request())).status_code == 400
    assert [status for _, status in provider.chats] == [400]
    assert (tmp_path / "learned_windows.json").exists()


async def test_an_error_that_is_not_a_refusal_goes_to_the_client_as_it_came(tmp_path: Path) -> None:
    def upstream(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(404)
        return httpx.Response(
            400, json={"error": {"message": "Invalid value for 'temperature'.", "code": None}}
        )

    settings = load_settings(
        env={}, overrides={"upstream.base_url": "http://local.test/v1", "state_dir": str(tmp_path)}
    )
    app = create_app(settings, transport=httpx.MockTransport(upstream))
    response = await post(app, long_request(2))
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "Invalid value for 'temperature'."


async def test_learning_can_be_turned_off(tmp_path: Path) -> None:
    provider = Provider(metadata=True)
    app = make_app(tmp_path, provider, **{"upstream.learn_windows": False})
    assert (await post(app, long_request())).status_code == 400
    assert provider.asked == []


async def test_the_learned_window_is_shown_on_readyz_and_in_the_sessions_list(tmp_path: Path) -> None:
    provider = Provider()
    app = make_app(tmp_path, provider)
    assert (await post(app, long_request(), **{"X-Session-Id": "shown"})).status_code == 200
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as client:
        ready = (await client.get("/readyz")).json()
        sessions = (await client.get("/v1/compaction/sessions")).json()["data"]
    assert ready["learned_windows"] == {MODEL: WINDOW}
    (row,) = [r for r in sessions if r.get("client_session") == "shown"]
    assert (row["window"], row["window_from"]) == (WINDOW, "provider")


async def test_a_request_that_cannot_fit_even_compacted_gets_the_providers_own_refusal(
    tmp_path: Path,
) -> None:
    provider = Provider("openai")
    app = make_app(tmp_path, provider)
    # Under `full` nothing is compacted: the request sent again would be the same.
    response = await post(app, long_request(), **{"X-Compaction-Policy": "full"})
    assert response.status_code == 400
    assert response.json() == refusal_body("openai", WINDOW, provider.chats[0][0])
    assert [status for _, status in provider.chats] == [400]  # not sent again: it could not fit
    assert "x-compaction-window-learned" not in response.headers
    assert (tmp_path / "learned_windows.json").exists()  # but the window is known now


async def test_the_event_says_the_upstreams_status(tmp_path: Path) -> None:
    provider = Provider()
    overrides = {"upstream.learn_windows": False, "events.record_skipped": True}
    app = make_app(tmp_path, provider, **overrides)
    assert (await post(app, long_request(), **{"X-Session-Id": "failed"})).status_code == 400
    assert (await post(app, long_request(2), **{"X-Session-Id": "fine"})).status_code == 200
    statuses = {e.get("client_session"): e["status"] for e in await events(app)}
    assert (statuses["failed"], statuses["fine"]) == (400, 200)
