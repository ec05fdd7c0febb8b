"""The summarizer pays with the credential the client's own request uses upstream, on every
door, with the operator's keys configured (``upstream.api_key``, ``anthropic.api_key``):

- a client with its own key: the summarizer call carries that key, never the operator's;
- a client with none (``allow_anonymous``), for which the upstream gets the operator's key:
  the operator's key pays;
- a client whose key the upstream refuses: the summarizer refuses it too, the ledger stands
  in, and its events show no summary the operator paid for;
- an Anthropic client whose provider is not the summarizer's host: the summarizer is not asked
  (its key may not go there, and the operator's may not pay for it).

No key ever reaches the proxy's log."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from tests.anthropic_upstream.server import AnthropicUpstream
from tests.e2e import test_anthropic_door as anthropic_door
from tests.e2e import test_responses_door as responses_door
from tests.fake_upstream import FakeUpstream, Recorded, Reply, completion

pytestmark = pytest.mark.e2e

OPERATOR = "sk-operator-openai-0000000000"
OPERATOR_ANT = "sk-ant-operator-0000000000"
CLIENT = "sk-client-own-key-1111111111"
REFUSED = "sk-client-refused-2222222222"
SUMMARY = "## Goal\nFix the parser.\n## Evidence\nEvery file was read; the checks passed."
CONFIG: dict[str, Any] = {
    "policy": "improved",
    "context_windows": {"default": 8_000},
    "upstream": {"api_key": OPERATOR},
    "anthropic": {"api_key": OPERATOR_ANT},
    # Asked at the point itself (prepare_at null), where the credential is chosen.
    "summarizer": {"kind": "openai", "model": "small-model", "prepare_at": None},
}
DOORS = ("chat", "responses", "anthropic")


def chat_history(steps: int = 30) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test"}]
    for i in range(steps):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": '{"n": 1}'}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        lines = "\n".join(f"file {i} line {n}: output of the command" for n in range(60))
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": lines})
    messages.append({"role": "user", "content": "Go on."})
    return messages


def presented(request: Recorded) -> str:
    """The credential a request carried (either header), as text."""
    return request.headers.get("authorization", "") + "|" + request.headers.get("x-api-key", "")


def answer(request: Recorded) -> Reply:
    """The upstream (and summarizer, on the same host): refuses REFUSED, answers the rest."""
    if REFUSED in presented(request):
        return Reply(status=401, body={"error": {"message": "invalid key", "type": "authentication_error"}})
    if is_summary_call(request):
        return Reply(body=completion(SUMMARY, model="small-model"))
    if request.path.endswith("/responses"):
        return Reply(body=responses_door.response([responses_door.message("ok")]))
    if request.path.endswith("/messages"):
        return Reply(body=anthropic_door.message([{"type": "text", "text": "ok"}]))
    return Reply(body=completion("ok"))


def is_summary_call(request: Recorded) -> bool:
    return request.path.endswith("/chat/completions") and b'"small-model"' in request.body


def send(proxy: Any, door: str, key: str | None) -> httpx.Response:
    headers = {"content-type": "application/json"}
    if door == "chat":
        path, body = "/v1/chat/completions", {"model": "gpt-4o", "messages": chat_history()}
    elif door == "responses":
        path, body = "/v1/responses", {"model": "gpt-5", "input": responses_door.history(30), "store": False}
    else:
        path = "/v1/messages"
        body = {"model": "claude-sonnet-4-5", "max_tokens": 512, "messages": anthropic_door.history()}
        headers["anthropic-version"] = "2023-06-01"
    if key is not None:
        headers.update({"x-api-key": key} if door == "anthropic" else {"authorization": f"Bearer {key}"})
    return httpx.post(proxy.url + path, content=orjson.dumps(body), headers=headers, timeout=30)


def summaries(event: Any) -> list[dict[str, Any]]:
    """Every summary an event records, wherever in it."""
    if isinstance(event, dict):
        own = [event] if "prompt_family" in event and "model" in event else []
        return own + [s for value in event.values() for s in summaries(value)]
    if isinstance(event, list):
        return [s for value in event for s in summaries(value)]
    return []


def events_of(proxy: Any, door: str, key: str | None) -> list[dict[str, Any]]:
    headers = (
        {}
        if key is None
        else {"x-api-key": key}
        if door == "anthropic"
        else {"authorization": f"Bearer {key}"}
    )
    response = httpx.get(proxy.url + "/v1/compaction/events", headers=headers, timeout=10)
    assert response.status_code == 200, response.text[:300]
    data: list[dict[str, Any]] = response.json()["data"]
    return data


def assert_no_key_logged(proxy: Any) -> None:
    log = proxy.log_path.read_text()
    for key in (OPERATOR, OPERATOR_ANT, CLIENT, REFUSED):
        assert key not in log


@pytest.mark.parametrize("door", DOORS)
def test_a_clients_own_key_pays_for_its_summary(start_proxy: Any, upstream: FakeUpstream, door: str) -> None:
    upstream.queue(*(Reply(dynamic=answer) for _ in range(10)))
    proxy = start_proxy(CONFIG)
    response = send(proxy, door, CLIENT)
    assert response.status_code == 200, response.text[:300]
    assert response.headers.get("x-compaction-trigger"), response.text[:300]
    calls = [r for r in upstream.requests if is_summary_call(r)]
    assert calls, "the model summarizer was not asked"
    for call in calls:
        assert (
            CLIENT in presented(call)
            and OPERATOR not in presented(call)
            and OPERATOR_ANT not in presented(call)
        )
    assert_no_key_logged(proxy)


@pytest.mark.parametrize("door", DOORS)
def test_the_operators_key_pays_for_a_client_it_pays_for_upstream(
    start_proxy: Any, upstream: FakeUpstream, door: str
) -> None:
    upstream.queue(*(Reply(dynamic=answer) for _ in range(10)))
    proxy = start_proxy({**CONFIG, "server": {"allow_anonymous": True}})
    response = send(proxy, door, None)
    assert response.status_code == 200, response.text[:300]
    upstream_gets = OPERATOR_ANT if door == "anthropic" else OPERATOR
    forwarded = [r for r in upstream.requests if not is_summary_call(r)]
    assert forwarded and all(upstream_gets in presented(r) for r in forwarded)
    calls = [r for r in upstream.requests if is_summary_call(r)]
    # The summarizer is at the provider the client addressed: it gets what the upstream gets.
    assert calls and all(upstream_gets in presented(call) for call in calls)
    assert any(s["model"] == "small-model" for e in events_of(proxy, door, None) for s in summaries(e))
    assert_no_key_logged(proxy)


@pytest.mark.parametrize("door", DOORS)
def test_a_refused_key_gets_no_summary_the_operator_paid_for(
    start_proxy: Any, upstream: FakeUpstream, door: str
) -> None:
    upstream.queue(*(Reply(dynamic=answer) for _ in range(10)))
    proxy = start_proxy(CONFIG)
    response = send(proxy, door, REFUSED)
    assert response.status_code == 401
    calls = [r for r in upstream.requests if is_summary_call(r)]
    assert calls, "the model summarizer was not asked"
    assert all(REFUSED in presented(c) and OPERATOR not in presented(c) for c in calls)
    recorded = [s for e in events_of(proxy, door, REFUSED) for s in summaries(e)]
    assert recorded, "no summary recorded"
    assert all(s["model"] == "ledger" and "401" in (s.get("fallback_reason") or "") for s in recorded)
    assert_no_key_logged(proxy)


def test_an_anthropic_clients_summary_elsewhere_is_not_paid_by_the_operator(
    start_proxy: Any, upstream: FakeUpstream
) -> None:
    anthropic = AnthropicUpstream(window=200_000, steps=1).start()
    try:
        upstream.queue(*(Reply(dynamic=answer) for _ in range(10)))
        proxy = start_proxy({**CONFIG, "anthropic": {"base_url": anthropic.base_url}})
        response = send(proxy, "anthropic", CLIENT)
        assert response.headers.get("x-compaction-trigger"), response.text[:300]
        # Its key may not go to the OpenAI host, and the operator's key pays nothing for it.
        assert not [r for r in upstream.requests if is_summary_call(r)]
        recorded = [s for e in events_of(proxy, "anthropic", CLIENT) for s in summaries(e)]
        assert recorded and all(
            s["model"] == "ledger" and "not asked" in (s.get("fallback_reason") or "") for s in recorded
        )
        assert_no_key_logged(proxy)
    finally:
        anthropic.stop()
