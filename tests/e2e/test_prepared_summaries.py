"""Summaries prepared ahead, through the running proxy: with a model summarizer that takes
2 seconds, an agent's growing session through compaction points never waits for it; the
summary prepared off the request path is in the view from the second point on; the event says
so; and without ``prepare_at`` the same point waits the summarizer's whole latency."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.fake_upstream import FakeUpstream, Recorded, Reply, completion

pytestmark = pytest.mark.e2e

KEY = "sk-prepared-0000000000000000"
SUMMARY = "The agent is running the scripted checks one by one; every check so far printed its log."
DELAY = 2.0


@pytest.fixture
def summarizer_server() -> Any:
    server = FakeUpstream().start()
    yield server
    server.stop()


def slow_summary(_: Recorded) -> Reply:
    return Reply(body=completion(SUMMARY, model="small-model"), delay=DELAY)


def step(i: int) -> list[Any]:
    output = "\n".join(f"check {i} line {n}: scanned module_{i}, all good" for n in range(60))
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": "run", "arguments": f'{{"n": {i}}}'}}
            ],
        },
        {"role": "tool", "tool_call_id": f"c{i}", "content": output},
    ]


def run_session(proxy: Any, steps: int, pause: float) -> list[tuple[float, str | None]]:
    messages: list[Any] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Run every check and report."},
    ]
    timings = []
    for i in range(steps):
        messages += step(i)
        started = time.perf_counter()
        answer = httpx.post(
            proxy.base_url + "/chat/completions",
            json={"model": "gpt-4o", "messages": messages},
            headers={"authorization": f"Bearer {KEY}", "x-session-id": "prepared-run"},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text[:300]
        timings.append((time.perf_counter() - started, answer.headers.get("x-compaction-trigger")))
        time.sleep(pause)
    return timings


def config(summarizer: FakeUpstream, prepare_at: float | None) -> dict[str, Any]:
    return {
        "policy": "improved",
        "context_windows": {"default": 8_000},
        "summarizer": {
            "kind": "openai",
            "model": "small-model",
            "base_url": summarizer.base_url,
            "api_key": "sk-summarizer",
            "prepare_at": prepare_at,
        },
    }


def points(proxy: Any) -> list[dict[str, Any]]:
    events = httpx.get(
        proxy.base_url + "/compaction/events",
        params={"session": "prepared-run"},
        headers={"authorization": f"Bearer {KEY}"},
    ).json()["data"]
    return [e for e in events if e["trigger"] and e["summary"]]


def test_a_compaction_point_never_waits_and_the_prepared_summary_joins(
    start_proxy: Any, upstream: FakeUpstream, summarizer_server: FakeUpstream
) -> None:
    summarizer_server.queue(*(Reply(dynamic=slow_summary) for _ in range(20)))
    proxy = start_proxy(config(summarizer_server, 0.5))
    timings = run_session(proxy, 22, pause=0.35)
    at_points = [seconds for seconds, trigger in timings if trigger]
    assert len(at_points) >= 2, timings
    # No step waited for the 2-second summarizer.
    assert max(seconds for seconds, _ in timings) < 1.0, timings
    made = points(proxy)
    prepared = [e["summary"]["prepared"] for e in made]
    assert prepared[0] in ("none_ready", "used"), prepared
    used = [e for e in made if e["summary"]["prepared"] == "used"]
    assert used and made.index(used[0]) <= 1, prepared
    assert used[0]["summary"]["model"] == "small-model"
    sent = [r.body.decode() for r in upstream.requests if b"chat/completions" in r.path.encode()]
    assert any(SUMMARY in body for body in sent)
    metrics = httpx.get(proxy.url + "/metrics").text
    assert 'compaction_proxy_prepared_summaries_total{result="used"}' in metrics
    print(f"\nprepared: steps {[round(s * 1000) for s, _ in timings]} ms; points {prepared}")


def test_without_prepare_at_a_compaction_point_waits_for_the_summarizer(
    start_proxy: Any, upstream: FakeUpstream, summarizer_server: FakeUpstream
) -> None:
    summarizer_server.queue(*(Reply(dynamic=slow_summary) for _ in range(20)))
    proxy = start_proxy(config(summarizer_server, None))
    timings = run_session(proxy, 12, pause=0.0)
    waited = [seconds for seconds, trigger in timings if trigger]
    assert waited and max(waited) >= DELAY, timings
