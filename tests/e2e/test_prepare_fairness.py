"""Many keys reaching the prepare mark at once, through the running proxy, with a keyless
2-second summarizer (a local model: the operator's capacity, paid by nobody's key).

300 made-up keys each send one request past the mark; the upstream refuses every one (401).
Then a real client's session grows to its compaction points. Before, each made-up key was a
tenant with a turn in the preparation queue ahead of the real one (300 turns, 4 at a time, 2 s
each: 150 s), and the real session's points found nothing ready. Now a keyless summarizer
prepares only for tenants the upstream has answered (``proxy/summaries/answered.py``): the
made-up keys prepare nothing, and the real session's summary is ready at its point."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.e2e.test_prepared_summaries import KEY, config, points, run_session, slow_summary, step
from tests.fake_upstream import FakeUpstream, Recorded, Reply, completion

pytestmark = pytest.mark.e2e

ATTACKERS = 300
MARKER = "made-up key session"


@pytest.fixture
def summarizer_server() -> Any:
    server = FakeUpstream().start()
    yield server
    server.stop()


def refuse_made_up_keys(request: Recorded) -> Reply:
    if request.headers.get("authorization") == f"Bearer {KEY}":
        return Reply(body=completion("ok"))
    error = {"error": {"message": "Incorrect API key provided.", "type": "invalid_request_error"}}
    return Reply(status=401, body=error)


def past_the_mark(n: int) -> dict[str, Any]:
    """A request of about 60% of the 8k window, under the compaction trigger."""
    messages: list[Any] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"{MARKER} {n}: run every check and report."},
    ]
    for i in range(5):
        messages += step(i)
    return {"model": "gpt-4o", "messages": messages}


def test_made_up_keys_do_not_hold_up_a_real_clients_prepared_summary(
    start_proxy: Any, upstream: FakeUpstream, summarizer_server: FakeUpstream
) -> None:
    upstream.queue(*(Reply(dynamic=refuse_made_up_keys) for _ in range(ATTACKERS + 200)))
    asked: list[str] = []
    lock = threading.Lock()

    def summarize(request: Recorded) -> Reply:
        with lock:
            asked.append("attacker" if MARKER.encode() in request.body else "client")
        return slow_summary(request)

    summarizer_server.queue(*(Reply(dynamic=summarize) for _ in range(ATTACKERS + 50)))
    proxy = start_proxy(config(summarizer_server, 0.5))

    def attack(n: int) -> int:
        answer = httpx.post(
            proxy.base_url + "/chat/completions",
            json=past_the_mark(n),
            headers={"authorization": f"Bearer sk-made-up-{n:04d}-000000000000"},
            timeout=60,
        )
        return answer.status_code

    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(attack, range(ATTACKERS)))
    assert statuses == [401] * ATTACKERS

    timings = run_session(proxy, 22, pause=0.35)
    made = points(proxy)
    prepared = [e["summary"]["prepared"] for e in made]
    print(f"\n{ATTACKERS} made-up keys; the client's points: {prepared}; summarizer asked {len(asked)}")
    assert len(made) >= 2 and any(t for _, t in timings)
    used = [e for e in made if e["summary"]["prepared"] == "used"]
    assert used and made.index(used[0]) <= 1, prepared
    # Nothing was prepared for a key the upstream refused.
    assert "attacker" not in asked and "client" in asked
