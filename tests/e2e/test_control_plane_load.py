"""The control plane off the data plane's path, as deployed: one tenant with 3,000 events polls
the sessions list from 20 clients while another tenant's compacting requests go through. Each
poll answers from the summary rows on the control plane's own SQLite thread, and the other
tenant's requests all succeed. How long they take against their time at rest is a ratio for
``benchmarks/control_plane.py`` (side by side in one run, over more requests), never a timed
assertion here: CI runs this beside other tests on two cores. That the data plane's
connection runs no statement for these reads is asserted in
tests/proxy/state/test_session_summaries.py."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.state.sessions import tenant_of
from proxy.state.sqlite_store import SQLiteStore
from tests.e2e.test_read_tool_output import history
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.e2e

POLLER_KEY, TIMED_KEY = "sk-poller", "sk-timed"
EVENTS, POLLERS, TIMED = 3000, 20, 7
# Each poller asks again this long after its answer: 20 of them are 50 times the session page
# open in 20 browsers (it asks every 5 s), yet leave the box CPU for the timed requests (20
# clients asking back to back saturate a 2-core box's proxy even on ``/healthz``).
PAUSE = 0.1
CONFIG: dict[str, Any] = {"policy": "improved", "context_windows": {"default": 8192}}


def fill(path: Path, tenant: str, count: int) -> None:
    """``count`` events of ``tenant`` over 100 sessions, each with some kilobytes as the real
    ones carry (a checkpoint, the read loop's record)."""

    async def write() -> None:
        store = SQLiteStore(path)
        pad = [{"handle": f"out_{n:016x}", "lines": n, "kind": "tool_result"} for n in range(20)]
        for i in range(count):
            event = {
                "event_id": f"ev{i:06d}",
                "session": f"s_{i % 100:04d}:improved",
                "time": time.time() - count + i,
                "policy": "improved",
                "model": "gpt-4o",
                "dialect": "chat",
                "tokens_before": 9000,
                "tokens_after": 3000,
                "trigger": "threshold",
                "checkpoint": {"offloaded": pad},
            }
            store.queue_event(tenant, event["session"], event)
        await store.flush_events()
        await store.close()

    asyncio.run(write())


_RUNS = itertools.count()


def timed_requests(proxy: Any, label: str) -> list[float]:
    """``TIMED`` requests, each a new session (so each compacts), timed one after another."""
    times = []
    label = f"{label}{next(_RUNS)}-"
    for n in range(TIMED):
        started = time.perf_counter()
        response = httpx.post(
            proxy.base_url + "/chat/completions",
            json={"model": "gpt-4o", "messages": history(f"{label}{n}")},
            headers={"authorization": f"Bearer {TIMED_KEY}", "x-session-id": f"{label}-{n}"},
            timeout=60,
        )
        times.append(time.perf_counter() - started)
        assert response.headers["x-compaction-trigger"] == "threshold"
    return times


def side_by_side(proxy: Any, pause: float = PAUSE, pollers: int = POLLERS) -> tuple[float, float, list[int]]:
    """The median of the timed tenant's requests at rest, then while ``pollers`` clients poll
    the other tenant's sessions list (``pause`` seconds between one client's polls)."""
    timed_requests(proxy, "warm")
    rest = statistics.median(timed_requests(proxy, "rest"))
    stop = threading.Event()
    polls: list[int] = []

    def poll() -> None:
        with httpx.Client(headers={"authorization": f"Bearer {POLLER_KEY}"}, timeout=60) as client:
            while not stop.is_set():
                listed = client.get(proxy.base_url + "/compaction/sessions")
                polls.append(len(listed.json()["data"]))
                stop.wait(pause)

    threads = [threading.Thread(target=poll) for _ in range(pollers)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.5)
        loaded = statistics.median(timed_requests(proxy, "load"))
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    return rest, loaded, polls


def poller_tenant() -> str:
    return tenant_of([(b"authorization", f"Bearer {POLLER_KEY}".encode())])


def test_polling_the_sessions_list_leaves_another_tenants_request_alone(
    start_proxy: Any, upstream: FakeUpstream, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    fill(state / "compaction.db", poller_tenant(), EVENTS)
    proxy = start_proxy(CONFIG, state_dir=state)
    rest, loaded, polls = side_by_side(proxy)
    assert polls and set(polls) == {50}  # every poll listed the tenant's 50 newest sessions
    print(f"rest {rest * 1000:.1f} ms, loaded {loaded * 1000:.1f} ms, {len(polls)} polls")
    assert rest > 0 and loaded > 0
