"""Canary mode through the running proxy: a sticky split of sessions across two replicas on
Redis, the holdout forwarded as the client sent it, the gate tripping on a treated arm that
the upstream answers with context-window errors (new sessions then go to the holdout, sessions
in flight keep their arm, a rollback event carries the figures), and not tripping on a healthy
upstream; ``canary status`` and ``resume`` on the same store."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest
import redis

from tests.e2e import test_anthropic_door as anthropic_door
from tests.e2e.test_read_tool_output import history
from tests.fake_upstream import FakeUpstream, Recorded, Reply, completion

pytestmark = pytest.mark.e2e

KEY = "sk-canary-tenant-0000000000"
ADMIN = "admin-token-canary-000000"
CONTEXT_ERROR = {
    "error": {
        "message": "This model's maximum context length is 8192 tokens. However, your messages resulted "
        "in 9001 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}


def canary_config(**gate: Any) -> dict[str, Any]:
    return {
        "policy": "improved",
        "mode": "canary",
        "context_windows": {"default": 8192},
        "canary": {"share": 0.5, "evaluate_every_seconds": 0.3, "gate": {"min_sessions": 15, **gate}},
        "server": {"admin_token": ADMIN},
    }


def ask(proxy: Any, session: str, messages: list[Any]) -> httpx.Response:
    return httpx.post(
        proxy.base_url + "/chat/completions",
        json={"model": "gpt-4o", "messages": messages},
        headers={"authorization": f"Bearer {KEY}", "x-session-id": session},
        timeout=30,
    )


def small(session: str, step: int) -> list[Any]:
    return [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"Task of {session}."},
        *[{"role": "assistant", "content": f"step {i}"} for i in range(step)],
    ]


def cached_usage(_: Recorded) -> Reply:
    body = completion("done")
    body["usage"] = {
        "prompt_tokens": 1200,
        "completion_tokens": 20,
        "total_tokens": 1220,
        "prompt_tokens_details": {"cached_tokens": 1024},
    }
    return Reply(body=body)


def canary_cli(proxy: Any, *args: str) -> subprocess.CompletedProcess[str]:
    """``compaction-proxy canary ARGS`` on the proxy's own configuration (its store)."""
    argv = [sys.executable, "-m", "proxy.cli", "canary", *args, "--config", str(proxy.config_path)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def status(proxy: Any) -> tuple[int, dict[str, Any]]:
    done = canary_cli(proxy, "status", "--json")
    return done.returncode, json.loads(done.stdout)


def metrics_of(proxy: Any) -> str:
    return httpx.get(proxy.base_url.removesuffix("/v1") + "/metrics").text


def wait_for(condition: Any, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError("timed out")


def test_sessions_split_and_stay_in_their_arm_across_two_replicas(
    start_proxy: Any, upstream: FakeUpstream, redis_url: str
) -> None:
    redis.Redis.from_url(redis_url).flushall()  # the Redis server is shared by the session's tests
    config = {**canary_config(), "store": {"backend": "redis", "redis_url": redis_url}}
    first, second = start_proxy(config), start_proxy(config)
    upstream.queue(*[Reply(dynamic=cached_usage) for _ in range(400)])
    arms: dict[str, str] = {}
    for i in range(200):
        session = f"session-{i}"
        one = ask(first, session, small(session, 1))
        two = ask(second, session, small(session, 2))
        assert one.status_code == two.status_code == 200
        assert one.headers["x-compaction-arm"] == two.headers["x-compaction-arm"], session
        arms[session] = one.headers["x-compaction-arm"]
    treated = sum(arm == "treated" for arm in arms.values())
    # Binomial(200, 0.5): 100 +- 3 standard deviations (7.1 each).
    assert 79 <= treated <= 121, treated
    # The holdout's bytes reach the upstream exactly as the client sent them.
    holdout = next(s for s, arm in arms.items() if arm == "holdout")
    sent = json.dumps({"model": "gpt-4o", "messages": small(holdout, 3)}).encode()
    response = httpx.post(
        first.base_url + "/chat/completions",
        content=sent,
        headers={
            "authorization": f"Bearer {KEY}",
            "x-session-id": holdout,
            "content-type": "application/json",
        },
    )
    assert response.headers["x-compaction-arm"] == "holdout" and upstream.requests[-1].body == sent
    # A healthy upstream: both replicas' figures judged together, and the gate passes.
    wait_for(lambda: status(first)[1]["arms"]["treated"]["requests"] >= 2 * treated)
    code, report = status(second)
    assert code == 0 and report["verdict"] == "pass" and report["paused"] is None, report
    assert report["arms"]["treated"]["sessions"] == treated
    assert report["arms"]["holdout"]["sessions"] == 200 - treated
    assert report["arms"]["treated"]["cached_prompt_tokens"] == 1024 * 2 * treated
    metrics = httpx.get(first.base_url.removesuffix("/v1") + "/metrics").text
    assert 'compaction_proxy_canary_tokens_total{arm="holdout",kind="cached"}' in metrics


def context_errors_for_compacted_views(request: Recorded) -> Reply:
    """The upstream refuses every compacted view (only the treated arm sends one)."""
    if b"handle=out_" in request.body:
        return Reply(status=400, body=CONTEXT_ERROR)
    return cached_usage(request)


@pytest.fixture(params=["sqlite", "redis-two-replicas"])
def replicas(request: pytest.FixtureRequest, start_proxy: Any) -> list[Any]:
    if request.param == "sqlite":
        return [start_proxy(canary_config())]
    url = request.getfixturevalue("redis_url")
    redis.Redis.from_url(url).flushall()  # the Redis server is shared by the session's tests
    store = {"backend": "redis", "redis_url": url}
    return [start_proxy({**canary_config(), "store": store}) for _ in range(2)]


def test_the_gate_pauses_the_policy_when_the_treated_arm_gets_context_errors(
    replicas: list[Any], upstream: FakeUpstream
) -> None:
    proxy = replicas[0]
    upstream.queue(*[Reply(dynamic=context_errors_for_compacted_views) for _ in range(200)])
    arms: dict[str, str] = {}
    for i in range(60):
        session = f"long-{i}"
        answer = ask(replicas[i % len(replicas)], session, history(f"RUN{i}"))
        arms[session] = answer.headers["x-compaction-arm"]
        assert answer.status_code == (400 if arms[session] == "treated" else 200)
    wait_for(lambda: status(proxy)[1]["paused"] is not None)
    code, report = status(proxy)
    assert code == 3 and "context_error_share" in report["paused"]["reason"]
    table = canary_cli(proxy, "status").stdout
    print("\n" + table)
    assert "PAUSED" in table and "BREACH" in table
    assert report["arms"]["treated"]["context_errors"] == sum(a == "treated" for a in arms.values())
    # Every replica sees the pause: new sessions go to the holdout; one already treated keeps its arm.
    for replica in replicas:
        wait_for(lambda r=replica: "compaction_proxy_canary_paused 1.0" in metrics_of(r))
        fresh = [
            ask(replica, f"new-{i}", small(f"new-{i}", 1)).headers["x-compaction-arm"] for i in range(20)
        ]
        assert fresh == ["holdout"] * 20
        in_flight = next(s for s, arm in arms.items() if arm == "treated")
        assert ask(replica, in_flight, small(in_flight, 1)).headers["x-compaction-arm"] == "treated"
    # The rollback event carries the figures that tripped it.
    events = httpx.get(
        proxy.base_url + "/compaction/events",
        params={"policy": "canary"},
        headers={"authorization": f"Bearer {ADMIN}"},
    ).json()["data"]
    rollback = next(e for e in events if e.get("kind") == "canary_rollback")
    assert rollback["arms"]["treated"]["context_errors"] >= 15
    assert any(c["check"] == "context_error_share" and c["breached"] for c in rollback["checks"])
    # Exactly one replica recorded the rollback.
    assert sum("compaction_proxy_canary_rollbacks_total 1.0" in metrics_of(r) for r in replicas) == 1
    paused_lines = [line for r in replicas for line in r.log_lines() if '"canary_paused"' in line]
    assert len(paused_lines) == 1 and json.loads(paused_lines[0])["reason"].startswith("context_error_share")
    # Resume: a new epoch, the policy back on for new sessions.
    assert canary_cli(proxy, "resume").returncode == 0
    for replica in replicas:
        wait_for(lambda r=replica: "compaction_proxy_canary_paused 0.0" in metrics_of(r))
    back = [
        ask(replicas[i % len(replicas)], f"after-{i}", small(f"after-{i}", 1)).headers["x-compaction-arm"]
        for i in range(30)
    ]
    assert "treated" in back
    code, report = status(proxy)
    assert report["paused"] is None and report["arms"]["treated"]["context_errors"] == 0


def test_cached_tokens_come_from_each_doors_own_usage(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy(canary_config())
    chat = completion("ok")
    chat["usage"] = {
        "prompt_tokens": 900,
        "completion_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 512},
    }
    responses = {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "model": "gpt-5",
        "output": [
            {
                "type": "message",
                "id": "m",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "ok", "annotations": []}],
            }
        ],
        "usage": {
            "input_tokens": 800,
            "input_tokens_details": {"cached_tokens": 256},
            "output_tokens": 7,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 807,
        },
    }
    anthropic = {
        **anthropic_door.message([{"type": "text", "text": "ok"}]),
        "usage": {
            "input_tokens": 40,
            "cache_read_input_tokens": 3000,
            "cache_creation_input_tokens": 600,
            "output_tokens": 9,
        },
    }
    upstream.queue(Reply(body=chat), Reply(body=responses), Reply(body=anthropic))
    headers = {"authorization": f"Bearer {KEY}"}
    arms = [
        httpx.post(
            proxy.base_url + "/chat/completions",
            headers={**headers, "x-session-id": "door-chat"},
            json={"model": "gpt-4o", "messages": small("door-chat", 1)},
        ),
        httpx.post(
            proxy.base_url + "/responses",
            headers={**headers, "x-session-id": "door-responses"},
            json={"model": "gpt-5", "input": "Fix the parser.", "store": False},
        ),
        httpx.post(
            proxy.base_url + "/messages",
            headers={"x-api-key": KEY, "anthropic-version": "2023-06-01", "x-session-id": "door-messages"},
            json={
                "model": "claude-sonnet-4-6",
                "max_tokens": 64,
                "messages": [{"role": "user", "content": "Fix the parser."}],
            },
        ),
    ]
    assert [a.status_code for a in arms] == [200, 200, 200]
    expected = {"treated": [0, 0, 0], "holdout": [0, 0, 0]}  # prompt, cached, written
    shapes = [(900, 512, 0), (800, 256, 0), (3640, 3000, 600)]
    for answer, (prompt, cached, written) in zip(arms, shapes, strict=True):
        figures = expected[answer.headers["x-compaction-arm"]]
        figures[0] += prompt
        figures[1] += cached
        figures[2] += written
    wait_for(
        lambda: (
            status(proxy)[1]["arms"]["treated"]["requests"] + status(proxy)[1]["arms"]["holdout"]["requests"]
            == 3
        )
    )
    report = status(proxy)[1]["arms"]
    for arm, (prompt, cached, written) in expected.items():
        assert (
            report[arm]["prompt_tokens"],
            report[arm]["cached_prompt_tokens"],
            report[arm]["cache_write_tokens"],
        ) == (prompt, cached, written), arm
