"""Replicas under faults, tested as deployed: three proxy processes on one Redis behind HAProxy
(round robin, no stickiness), 200 agent sessions at once in canary mode with reads of saved
outputs; one replica killed with SIGKILL a third of the way in, Redis stopped and started again
on its port and files two thirds in. Every session finishes (the OpenAI SDK retrying a request
cut by the kill), the model sees no broken tool-call protocol, every read the proxy answers
finds its output and every saved output is still in Redis at the end, each session keeps one
arm whichever replica answers, and the replicas agree on the gate.

The gate is set to pause on the treated arm's reads (no re-acquisition tolerated beyond the
holdout's, which has nothing to read): it pauses while the sessions run, on whichever replica
judges first, once. Sessions in flight keep their arm across the pause, every replica says
paused, and new sessions then go to the holdout whichever replica they reach."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.agent_upstream import READ_TOOL, AgentUpstream, Seen
from tests.replicas_cluster import ADMIN, Cluster, Progress, run_agents

pytestmark = pytest.mark.e2e

SESSIONS = 200
STEPS = 8
LINES = 40  # about 900 tokens a step
WINDOW = 4096  # the proxy's idea of the window: the treated arm compacts and reads
MODEL_WINDOW = 32768  # what the model enforces: the holdout, sent uncompacted, fits
CONFIG: dict[str, Any] = {
    "policy": "improved",
    "mode": "canary",
    "context_windows": {"default": WINDOW},
    # Any read beyond the holdout's (none) is a breach: the gate pauses while the sessions run.
    "canary": {
        "share": 0.5,
        "evaluate_every_seconds": 0.5,
        "gate": {"min_sessions": 20, "reacquisition_floor": 0.0, "max_reacquisition_ratio": 1.0},
    },
    "server": {"admin_token": ADMIN},
}
PAUSED = re.compile(r"^compaction_proxy_canary_paused (\S+)$", re.M)


@pytest.fixture
def model() -> Iterator[AgentUpstream]:
    server = AgentUpstream(window=MODEL_WINDOW, steps=STEPS, read_every=2, output_lines=LINES).start()
    yield server
    server.stop()


@pytest.fixture
def cluster(tmp_path: Path, model: AgentUpstream) -> Iterator[Cluster]:
    started = Cluster(tmp_path, model.base_url, replicas=3, config=CONFIG)
    try:
        yield started.start()
    finally:
        started.stop()


def read_results(follow_up: Seen) -> list[str]:
    """The results of the read calls answered in a read follow-up round."""
    messages = follow_up.body["messages"]
    reads = {
        call["id"]
        for m in messages
        if m.get("role") == "assistant"
        for call in m.get("tool_calls") or []
        if call["function"]["name"] == READ_TOOL
    }
    return [str(m.get("content")) for m in messages if m.get("tool_call_id") in reads]


def test_sessions_survive_a_killed_replica_and_a_redis_restart(
    cluster: Cluster, model: AgentUpstream
) -> None:
    total = SESSIONS * STEPS
    faults: dict[str, float] = {}

    async def faults_midway(progress: Progress) -> None:
        await progress.reach(total // 3)
        cluster.kill_replica(1)
        faults["killed_at_step"] = progress.steps
        await progress.reach(2 * total // 3)
        faults["redis_away_seconds"] = cluster.restart_redis()
        faults["redis_restarted_at_step"] = progress.steps

    started, progress = time.monotonic(), Progress()
    runs = asyncio.run(run_agents(cluster.base_url, SESSIONS, STEPS, LINES, faults_midway, progress))
    took, ended = time.monotonic() - started, time.time()
    retries = progress.attempts - sum(r.requests for r in runs)
    steps = sum(r.steps_done for r in runs)
    print(f"\n{SESSIONS} sessions, {steps} steps, {len(model.requests)} model requests")
    print(f"in {took:.1f} s; faults {faults}; SDK retries {retries}; reads {len(model.reads)}")

    # Every session finished: the model issued all its steps and gave its final answer.
    unfinished = [r.name for r in runs if not r.finished]
    assert unfinished == [], f"{len(unfinished)} sessions did not finish: {unfinished[:5]}"
    assert len(model.conversations) == SESSIONS
    assert all(c.finished and c.step == STEPS for c in model.conversations.values())
    assert model.problems == [] and model.rejected == [] and model.task_not_kept == []
    assert set(faults) == {"killed_at_step", "redis_away_seconds", "redis_restarted_at_step"}
    # The kill cut requests in flight (HAProxy answered them 502): the SDK sent them again.
    assert retries >= 1

    # Reads happened, and every one the proxy answered found its output.
    assert len(model.reads) >= SESSIONS // 4, model.summary()[-2000:]
    results = [text for s in model.follow_ups for text in read_results(s)]
    failed = [text[:160] for text in results if text.startswith("Error:")]
    assert results and failed == [], f"{len(failed)} of {len(results)} reads failed: {failed[:5]}"
    # No saved output lost: every handle the model was shown is still in Redis after the restart.
    shown = {h for s in model.requests for h in s.handles}
    keys = redis.Redis.from_url(cluster.redis_url).scan_iter("cpx:out:*")
    stored = {key.decode().rsplit(":", 1)[1] for key in keys}
    lost = sorted(shown - stored)
    assert shown and lost == [], f"{len(lost)} of {len(shown)} saved outputs lost: {lost[:5]}"

    # One arm per session, whichever replica answered; both arms used; every replica served.
    split = [r.name for r in runs if len(r.arms) != 1]
    assert split == [], f"sessions answered in two arms: {split[:5]}"
    arms = [next(iter(r.arms)) for r in runs]
    assert 0.3 * SESSIONS < arms.count("treated") < 0.7 * SESSIONS and arms.count("holdout") > 0
    assert {name for r in runs for name in r.replicas} == {"r0", "r1", "r2"}
    # Round robin per request: nearly every session was answered by more than one replica.
    assert sum(len(r.replicas) > 1 for r in runs) >= 0.9 * SESSIONS

    # The gate paused once, on one replica, and every replica still running says so.
    states = set()
    for replica in cluster.live():
        found = PAUSED.search(httpx.get(replica.url + "/metrics", timeout=10, trust_env=False).text)
        assert found is not None
        states.add(found.group(1))
    assert states == {"1.0"}, states
    rollbacks = [
        e
        for e in httpx.get(
            cluster.base_url + "/compaction/events",
            params={"policy": "canary"},
            headers={"authorization": f"Bearer {ADMIN}"},
            timeout=10,
            trust_env=False,
        ).json()["data"]
        if e.get("kind") == "canary_rollback"
    ]
    assert len(rollbacks) == 1 and rollbacks[0]["reason"] == ["reacquisitions_per_session"], rollbacks
    # It paused while the sessions ran: those in flight then kept their arm (checked above).
    print(f"paused {ended - rollbacks[0]['time']:.1f} s before the sessions ended")
    assert rollbacks[0]["time"] < ended
    # New sessions, each request on the next replica: the holdout everywhere.
    late = asyncio.run(run_agents(cluster.base_url, 12, STEPS, LINES, prefix="after-pause"))
    assert all(r.finished and r.arms == {"holdout"} for r in late), [(r.name, r.arms) for r in late]
    assert {name for r in late for name in r.replicas} == {"r0", "r2"}  # r1 was killed
    # Treated sessions were compacted (the arm meant something): the model saw handles.
    treated = {r.name for r in runs if "treated" in r.arms}
    with_handles = {s.headers.get("x-agent-run") for s in model.requests if s.handles}
    assert with_handles <= treated and len(with_handles) >= len(treated) // 2
