"""The Gemini door end to end: the real proxy (``compaction-proxy serve``) between a Gemini
CLI-like agent loop (``tests/gemini_upstream/client.py``: Gemini CLI 0.61.0's bodies and
history) and the fake Gemini API (``tests/gemini_upstream``), which enforces an 8k window in the
API's own words and its protocol checks (every ``functionCall`` answered part for part, thought
signatures echoed on their part). A long run that fails direct completes through the proxy,
streamed and not: every request reaches the fake within its window with every call answered
and every signature where it was given, outputs are offloaded, the model's ``read_tool_output``
calls are answered inside the proxy (the client never sees one), the key goes upstream in
``x-goog-api-key`` whether the client sent it there or in ``?key=`` (and never in a URL or a
log line), and the proxy's own errors are in Google's shape."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.gemini_upstream import HANDLE, GeminiUpstream
from tests.gemini_upstream.client import MODEL, run_agent

pytestmark = pytest.mark.e2e

WINDOW = 8192
STEPS = 12
KEY = "AIza-gemini-door-0000000000000"
TASK = "Run the twelve checks one by one and report what failed."


@pytest.fixture
def fake() -> Iterator[Callable[..., GeminiUpstream]]:
    started: list[GeminiUpstream] = []

    def start(**options: Any) -> GeminiUpstream:
        settings = {"window": WINDOW, "steps": STEPS, "read_every": 4, "api_key": KEY, **options}
        server = GeminiUpstream(**settings).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def config(fake: GeminiUpstream) -> dict[str, Any]:
    return {
        "policy": "improved",
        "gemini": {"base_url": fake.base_url, "code_assist_url": fake.base_url},
        # The fake counts 10% over the packaged encoding: the factor keeps the proxy under it.
        "models": {"gemini-*": {"window": WINDOW, "token_factor": 1.2}},
    }


def test_a_long_run_fails_direct_at_the_window(fake: Callable[..., GeminiUpstream]) -> None:
    server = fake()
    with pytest.raises(AssertionError, match="exceeds the maximum number of tokens allowed"):
        run_agent(server.base_url, stream=True, run="direct", key=KEY, task=TASK)
    refused = [s for s in server.requests if s.kind == "refused"]
    assert len(refused) == 1 and refused[0].tokens > WINDOW


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_a_long_run_completes_through_the_proxy_within_the_window(
    fake: Callable[..., GeminiUpstream], start_proxy: Any, stream: bool
) -> None:
    server = fake()
    proxy = start_proxy(config(server))
    seen = run_agent(proxy.url, stream=stream, run=f"through-{stream}", key=KEY, task=TASK)
    requests = server.requests
    assert [s.kind for s in requests if s.kind in ("refused", "invalid", "unauthorized")] == []
    assert max(s.tokens for s in requests) <= WINDOW
    assert all(s.problems == [] and s.signature_problems == [] and s.leaks == [] for s in requests), [
        (s.index, s.problems, s.signature_problems, s.leaks)
        for s in requests
        if s.problems or s.signature_problems or s.leaks
    ]
    assert all(s.model == MODEL and s.stream == stream for s in requests)
    # Outputs were offloaded (the views name handles) and the model read some back inside the proxy.
    assert any(s.handles for s in requests)
    follow_ups = [s for s in requests if s.read_follow_up]
    assert follow_ups and all(s.offered_read for s in requests if s.kind == "read")
    assert len(requests) == len(seen.answers) + len(follow_ups)
    # The client never saw the read tool, its calls or its rounds.
    assert all(b"read_tool_output" not in raw for raw in seen.raw)
    assert sum(1 for parts in seen.answers if any("functionCall" in p for p in parts)) == STEPS
    # The key went upstream in its header, never in a URL.
    assert all(s.headers.get("x-goog-api-key") == KEY and "key=" not in s.query for s in requests)
    assert not any(KEY in line for line in proxy.log_lines())
    # The factor is calibrated from the prompt tokens the answers report (usageMetadata).
    events = httpx.get(proxy.base_url + "/compaction/events", headers={"x-goog-api-key": KEY}).json()["data"]
    counts = [e["token_count"] for e in events if (e.get("token_count") or {}).get("reported")]
    assert counts and all(c["factor"] > 1.0 for c in counts)


def test_a_key_in_the_query_goes_upstream_in_its_header(
    fake: Callable[..., GeminiUpstream], start_proxy: Any
) -> None:
    server = fake(steps=2)
    proxy = start_proxy(config(server))
    run_agent(proxy.url, stream=True, run="query-key", key=KEY, task="Two checks.", key_in_query=True)
    assert server.requests and all(s.headers.get("x-goog-api-key") == KEY for s in server.requests)
    assert all("key=" not in s.query and s.query == "alt=sse" for s in server.requests)
    assert not any(KEY in line for line in proxy.log_lines())


def test_the_proxys_own_errors_are_in_googles_shape(
    fake: Callable[..., GeminiUpstream], start_proxy: Any
) -> None:
    server = fake()
    proxy = start_proxy(config(server))
    url = f"{proxy.url}/v1beta/models/{MODEL}:generateContent"
    headers = {"x-goog-api-key": KEY, "content-type": "application/json"}
    bad = httpx.post(url, content=b'{"contents": 7}', headers=headers, trust_env=False)
    assert bad.status_code == 400
    error = bad.json()["error"]
    assert error["status"] == "INVALID_ARGUMENT" and error["code"] == 400 and "contents" in error["message"]
    unknown = httpx.post(url, content=b'{"contents": []}', headers={**headers, "x-compaction-policy": "nope"})
    assert unknown.status_code == 400 and unknown.json()["error"]["status"] == "INVALID_ARGUMENT"
    # A route of the Gemini API the proxy does not compact is relayed verbatim.
    model = httpx.get(f"{proxy.url}/v1beta/models/{MODEL}", headers=headers, trust_env=False)
    assert model.status_code == 200 and model.json()["inputTokenLimit"] == WINDOW
    assert ("GET", f"/v1beta/models/{MODEL}") in server.others


def test_the_handles_the_model_read_are_the_views(
    fake: Callable[..., GeminiUpstream], start_proxy: Any
) -> None:
    server = fake(steps=8)
    proxy = start_proxy(config(server))
    run_agent(proxy.url, stream=True, run="reads", key=KEY, task="Eight checks.")
    reads = [s for s in server.requests if s.kind == "read"]
    assert reads
    for seen in reads:
        (call,) = [p["functionCall"] for p in seen.parts if "functionCall" in p]
        assert HANDLE.fullmatch(f"handle={call['args']['handle']}") and call["args"]["handle"] in seen.handles


@pytest.mark.parametrize("wrapped", [False, True], ids=["contents", "generateContentRequest"])
def test_count_tokens_counts_the_compacted_view(
    fake: Callable[..., GeminiUpstream], start_proxy: Any, wrapped: bool
) -> None:
    server = fake()
    proxy = start_proxy(config(server))
    history = run_agent(proxy.url, stream=True, run=f"count-{wrapped}", key=KEY, task=TASK).body
    direct = server.count(history)
    assert direct > WINDOW  # the history as the client holds it would not fit
    body: dict[str, Any] = {"contents": history["contents"]}
    if wrapped:
        body = {"generateContentRequest": {"model": f"models/{MODEL}", **history}}
    response = httpx.post(
        f"{proxy.url}/v1beta/models/{MODEL}:countTokens",
        json=body,
        headers={"x-goog-api-key": KEY},
        trust_env=False,
        timeout=60,
    )
    assert response.status_code == 200, response.text
    total = response.json()["totalTokens"]
    counted, said = server.counted[-1]
    assert said == total and total <= WINDOW < direct
    assert len(counted["contents"]) < len(history["contents"])  # the view the model would see


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_the_code_assist_path_is_compacted_the_same_way(
    fake: Callable[..., GeminiUpstream], start_proxy: Any, stream: bool
) -> None:
    server = fake(steps=8)
    proxy = start_proxy(config(server))
    seen = run_agent(proxy.url, stream=stream, run=f"gca-{stream}", key=KEY, task=TASK, code_assist=True)
    requests = server.requests
    assert requests and all(
        s.path == f"/v1internal:{'streamGenerateContent' if stream else 'generateContent'}" for s in requests
    )
    assert [s.kind for s in requests if s.kind in ("refused", "invalid", "unauthorized")] == []
    assert max(s.tokens for s in requests) <= WINDOW
    assert all(s.problems == [] and s.signature_problems == [] and s.leaks == [] for s in requests)
    assert any(s.handles for s in requests) and any(s.read_follow_up for s in requests)
    assert all(b"read_tool_output" not in raw for raw in seen.raw)
    assert all(s.headers.get("authorization") == f"Bearer {KEY}" for s in requests)


def test_a_long_history_is_compacted_in_a_worker_process_for_its_paths_model(
    fake: Callable[..., GeminiUpstream], start_proxy: Any
) -> None:
    """Past ``large_request_messages`` contents, a body is read and compacted in a worker
    process, which gets the model and the stream from the path as the event loop does."""
    server = fake()
    proxy = start_proxy({**config(server), "server": {"large_request_messages": 10}})
    run_agent(proxy.url, stream=True, run="worker", key=KEY, task=TASK)
    requests = server.requests
    assert [s.kind for s in requests if s.kind in ("refused", "invalid", "unauthorized")] == []
    assert max(s.tokens for s in requests) <= WINDOW and any(s.read_follow_up for s in requests)
    assert all(s.problems == [] and s.signature_problems == [] and s.leaks == [] for s in requests)
    events = httpx.get(proxy.base_url + "/compaction/events", headers={"x-goog-api-key": KEY}).json()["data"]
    large = [e for e in events if (e.get("details") or {}).get("large_request")]
    assert large and all(e["details"]["large_request"]["worker_process"] is True for e in large)
    assert {e["model"] for e in events} == {MODEL} and {e["dialect"] for e in events} == {"gemini"}


def test_shadow_mode_sends_the_original_and_asks_the_view_for_one_json_answer(
    fake: Callable[..., GeminiUpstream], start_proxy: Any
) -> None:
    """Shadow mode through the Gemini door: the client's stream goes as sent (the fake's window
    is the real model's), the view made for the configured 8k window is asked in the background
    at ``:generateContent`` for the path's model, and the decisions compared in the event."""
    server = fake(window=1_048_576, steps=6)
    shadow = {"mode": "shadow", "shadow": {"compare": True, "sample_rate": 1.0}}
    proxy = start_proxy({**config(server), **shadow})
    run_agent(proxy.url, stream=True, run="shadow", key=KEY, task=TASK)
    deadline = time.monotonic() + 20
    while True:
        events = httpx.get(proxy.base_url + "/compaction/events", headers={"x-goog-api-key": KEY}).json()[
            "data"
        ]
        compared = [e["shadow_compare"] for e in events if e.get("shadow_compare")]
        if len(compared) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(compared) >= 3 and all(c["error"] is None and c["shadow"] for c in compared), compared
    asked = [s for s in server.requests if not s.stream]
    assert asked and all(s.path == f"/v1beta/models/{MODEL}:generateContent" and s.query == "" for s in asked)
    assert all(s.problems == [] and s.signature_problems == [] for s in server.requests)
    assert max(s.tokens for s in asked) < max(s.tokens for s in server.requests if s.stream)


def test_the_window_is_learned_from_the_apis_refusal(
    fake: Callable[..., GeminiUpstream], start_proxy: Any
) -> None:
    """With no window configured for the model, the API's "The input token count (N) exceeds
    the maximum number of tokens allowed (M)." teaches it: the request is compacted to it and
    sent again, and the agent never sees the refusal."""
    server = fake()
    proxy = start_proxy({"policy": "improved", "gemini": {"base_url": server.base_url}})
    run_agent(proxy.url, stream=True, run="learn", key=KEY, task=TASK)
    refused = [s.index for s in server.requests if s.kind == "refused"]
    assert len(refused) == 1 and server.requests[refused[0] + 1].tokens <= WINDOW
    assert all(s.tokens <= WINDOW for s in server.requests[refused[0] + 1 :])
    learned = [line for line in proxy.log_lines() if "model_window_refused" in line]
    assert learned and '"window":8192' in learned[0] and '"retried":true' in learned[0]
