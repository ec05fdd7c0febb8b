"""Summaries prepared ahead, through the running proxy: with a model summarizer that takes
2 seconds, an agent's growing session through compaction points never waits for it; the
summary prepared off the request path is in the view from the second point on; the event says
so; and without ``prepare_at`` the same point waits the summarizer's whole latency."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import redis

from tests.e2e import test_anthropic_door as anthropic_door
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
            # Keyless, as a local model: the operator's summarizer.api_key would pay only for
            # clients that send no key (credentials.py), and these clients send their own.
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


def until_a_point(proxy: Any, messages: list[Any], first: int) -> int:
    """Steps from ``first`` on ``proxy`` until one is a compaction point; the next step's number."""
    for i in range(first, first + 30):
        messages += step(i)
        answer = httpx.post(
            proxy.base_url + "/chat/completions",
            json={"model": "gpt-4o", "messages": messages},
            headers={"authorization": f"Bearer {KEY}", "x-session-id": "prepared-run"},
            timeout=60,
        )
        assert answer.status_code == 200 and answer.elapsed.total_seconds() < 1.0
        if answer.headers.get("x-compaction-trigger"):
            return i + 1
    raise AssertionError("no compaction point")


def prepared_then_next_point(
    first: Any, second: Any, edit: Callable[[list[Any]], None] | None = None
) -> list[dict[str, Any]]:
    """A session's first compaction point (on ``first``) finds nothing ready and prepares its
    range; once that is ready, the history (``edit``ed if given) grows to the next point, on
    ``second``. The points' events."""
    messages: list[Any] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Run every check and report."},
    ]
    following = until_a_point(first, messages, 0)
    time.sleep(DELAY + 1.0)  # this point's range is prepared
    if edit is not None:
        edit(messages)
    until_a_point(second, messages, following)
    return points(first)


def prepared_counted(proxy: Any, result: str) -> bool:
    metrics = httpx.get(proxy.url + "/metrics").text
    return f'compaction_proxy_prepared_summaries_total{{result="{result}"}} 1.0' in metrics


def test_a_summary_prepared_by_one_replica_is_used_by_another(
    start_proxy: Any, upstream: FakeUpstream, summarizer_server: FakeUpstream, redis_url: str
) -> None:
    redis.Redis.from_url(redis_url).flushall()  # the Redis server is shared by the session's tests
    summarizer_server.queue(*(Reply(dynamic=slow_summary) for _ in range(20)))
    shared = {**config(summarizer_server, 0.5), "store": {"backend": "redis", "redis_url": redis_url}}
    first, second = start_proxy(shared), start_proxy(shared)
    # The first replica's first point finds nothing ready and prepares that range, which the
    # second replica's next point takes from Redis.
    made = prepared_then_next_point(first, second)
    assert [e["summary"]["prepared"] for e in made] == ["none_ready", "used"], made
    assert made[1]["summary"]["model"] == "small-model"
    assert prepared_counted(second, "used")


def test_the_messages_door_never_waits_either(
    start_proxy: Any, upstream: FakeUpstream, summarizer_server: FakeUpstream
) -> None:
    summarizer_server.queue(*(Reply(dynamic=slow_summary) for _ in range(20)))
    answer = anthropic_door.message([{"type": "text", "text": "ok"}])
    upstream.queue(*(Reply(body=answer) for _ in range(30)))
    proxy = start_proxy(config(summarizer_server, 0.5))
    messages: list[Any] = [{"role": "user", "content": "Run every check and report."}]
    slowest, triggers = 0.0, []
    for i in range(22):
        output = "\n".join(f"check {i} line {n}: scanned module_{i}, all good" for n in range(60))
        messages += [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"t{i}", "name": "run", "input": {"n": i}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": output}]},
        ]
        started = time.perf_counter()
        response = httpx.post(
            proxy.base_url + "/messages",
            json={
                "model": "claude-sonnet-4-6",
                "max_tokens": 256,
                "messages": messages,
                "tools": [{"name": "run", "input_schema": {"type": "object"}}],
            },
            headers={"x-api-key": KEY, "anthropic-version": "2023-06-01", "x-session-id": "prepared-run"},
            timeout=60,
        )
        assert response.status_code == 200, response.text[:300]
        slowest = max(slowest, time.perf_counter() - started)
        triggers.append(response.headers.get("x-compaction-trigger"))
        time.sleep(0.35)
    assert sum(t is not None for t in triggers) >= 2 and slowest < 1.0, (triggers, slowest)
    assert "used" in [e["summary"]["prepared"] for e in points(proxy)]


def test_a_conversation_edited_under_a_prepared_summary_does_not_get_it(
    start_proxy: Any, upstream: FakeUpstream, summarizer_server: FakeUpstream
) -> None:
    """The client edits a message the prepared summary covers (a re-run output, a rewritten
    history): its digests no longer match, and the point uses the ledger, recording ``stale``."""
    summarizer_server.queue(*(Reply(dynamic=slow_summary) for _ in range(20)))
    proxy = start_proxy(config(summarizer_server, 0.5))

    def edit(messages: list[Any]) -> None:
        messages[3] = {**messages[3], "content": "check 0 was run again: 3 failures"}

    made = prepared_then_next_point(proxy, proxy, edit)
    assert [e["summary"]["prepared"] for e in made] == ["none_ready", "stale"], made
    assert made[1]["summary"]["model"] == "ledger" and made[1]["checkpoint_dropped"]
    assert prepared_counted(proxy, "stale")


def test_shadow_mode_prepares_and_never_waits_too(
    start_proxy: Any, upstream: FakeUpstream, summarizer_server: FakeUpstream
) -> None:
    summarizer_server.queue(*(Reply(dynamic=slow_summary) for _ in range(20)))
    proxy = start_proxy({**config(summarizer_server, 0.5), "mode": "shadow"})
    timings = run_session(proxy, 22, pause=0.35)
    assert max(seconds for seconds, _ in timings) < 1.0, timings
    assert "used" in [e["summary"]["prepared"] for e in points(proxy)]
    assert all(SUMMARY not in r.body.decode() for r in upstream.requests)  # the client's bytes went
