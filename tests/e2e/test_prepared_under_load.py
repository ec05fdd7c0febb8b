"""Prepared summaries through Redis under load: three proxy replicas on one Redis store, 48
sessions of four tenants (one API key each; the same session ids in every tenant) growing
through three compaction points each at once, each session's steps going round the replicas,
and a model summarizer that takes a second (and answers 500 for the sessions of one in eight).

What would catch a real bug: every request answered; a session's points find the summary
prepared ahead, whichever replica made it; no preparation used by two points, nor one that
covers less than the summary it replaces; a view only ever carries summaries made for its own
session (each summary names the session whose messages it was asked about, and its serial); no
point calls the summarizer itself; one preparation a point, not one per replica; the replicas'
metrics say what the events say; and Redis keeps at most the next point's preparation of a
session, never one already used, and nothing without an expiry. The failing sessions' points
stand on the ledger, answered as the others."""

from __future__ import annotations

import itertools
import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
import redis

from proxy.state.redis_store import RedisStore
from proxy.state.sessions import explicit_session, tenant_of
from proxy.summaries.prepared_store import RedisPrepared
from tests.fake_upstream import FakeUpstream, Recorded, Reply, completion

pytestmark = pytest.mark.e2e

DELAY = 1.0
TIMEOUT = 30  # the summarizer's: how long a claim to prepare a session's next point holds
REPLICAS = 3
TENANTS = 4
PER_TENANT = 12
STEPS = 16
PAUSE = 0.75
# One session in eight gets a summarizer answering 500, whoever asks.
FAILING = {n for n in range(TENANTS * PER_TENANT) if n % 8 == 5}
MARKER = re.compile(r"\bmarker (T\dS\d\d)\b")
TASK = re.compile(r"^Run every check of marker (T\dS\d\d) and report\.$")
STEP = re.compile(r'run\(\{\\"n\\": (\d+)\}\)')
SERIAL = re.compile(r"\bprep (P\d{4})\b")


def marker_of(number: int) -> str:
    return f"T{number // PER_TENANT}S{number % PER_TENANT:02d}"


def key_of(tenant: int) -> str:
    return f"sk-load-tenant-{tenant}-0000000000000000"


class SlowSummarizer:
    """A model summarizer taking ``DELAY``: its summary names the session whose messages it was
    asked about, and a serial of its own (which session each serial was made for is kept)."""

    def __init__(self) -> None:
        self.server = FakeUpstream().start()
        self.serials = itertools.count(1)
        self.made: dict[str, str] = {}  # serial -> marker
        self.reach: dict[str, int] = {}  # serial -> the newest step it summarized
        self.failed = 0
        self.server.queue(*(Reply(dynamic=self.reply) for _ in range(20_000)))

    def reply(self, request: Recorded) -> Reply:
        markers = set(MARKER.findall(request.body.decode()))
        assert len(markers) == 1, markers  # a summary request holds one session's messages
        marker = markers.pop()
        if (int(marker[1]) * PER_TENANT + int(marker[3:])) in FAILING:
            self.failed += 1
            return Reply(status=500, body={"error": {"message": "overloaded", "type": "server_error"}})
        serial = f"P{next(self.serials):04d}"
        self.made[serial] = marker
        self.reach[serial] = max((int(n) for n in STEP.findall(request.body.decode())), default=-1)
        text = f"The checks of marker {marker} ran one by one and all passed so far (prep {serial})."
        return Reply(body=completion(text, model="small-model"), delay=DELAY)


@pytest.fixture
def summarizer() -> Any:
    fake = SlowSummarizer()
    yield fake
    fake.server.stop()


def step(marker: str, i: int) -> list[Any]:
    output = "\n".join(f"check {i} line {n}: marker {marker} scanned module_{i}, all good" for n in range(50))
    call = {"id": f"c{i}", "type": "function", "function": {"name": "run", "arguments": f'{{"n": {i}}}'}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{i}", "content": output},
    ]


@dataclass
class Run:
    number: int
    statuses: list[int] = field(default_factory=list)
    points: list[int] = field(default_factory=list)  # the steps that were compaction points
    slowest: float = 0.0

    @property
    def marker(self) -> str:
        return marker_of(self.number)

    @property
    def tenant(self) -> int:
        return self.number // PER_TENANT

    @property
    def session_id(self) -> str:
        return f"load-{self.number % PER_TENANT:02d}"  # the same ids in every tenant


def drive(proxies: list[Any], run: Run) -> Run:
    """One agent session: its step k goes to replica (number + k) % replicas."""
    time.sleep(0.03 * run.number)  # the sessions start staggered, as agents do
    messages: list[Any] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"Run every check of marker {run.marker} and report."},
    ]
    headers = {"authorization": f"Bearer {key_of(run.tenant)}", "x-session-id": run.session_id}
    with httpx.Client(timeout=60) as client:
        for k in range(STEPS):
            messages += step(run.marker, k)
            proxy = proxies[(run.number + k) % len(proxies)]
            answer = client.post(
                proxy.base_url + "/chat/completions",
                json={"model": "gpt-4o", "messages": messages},
                headers=headers,
            )
            run.statuses.append(answer.status_code)
            run.slowest = max(run.slowest, answer.elapsed.total_seconds())
            if answer.headers.get("x-compaction-trigger"):
                run.points.append(k)
            time.sleep(PAUSE)  # the agent's turn: longer than the summarizer, as a model's is
    return run


def prep_key(run: Run) -> str:
    """The Redis key of the session's prepared summary (the proxy's session is per policy)."""
    tenant = tenant_of([(b"authorization", f"Bearer {key_of(run.tenant)}".encode())])
    return f"cpx:prep:{tenant}:{explicit_session(tenant, run.session_id)}:improved"


def point_events(proxy: Any, run: Run) -> list[dict[str, Any]]:
    """The session's compaction points, as its tenant reads them (on any replica: Redis)."""
    for _ in range(50):
        events = httpx.get(
            proxy.base_url + "/compaction/events",
            params={"session": run.session_id, "limit": 1000},
            headers={"authorization": f"Bearer {key_of(run.tenant)}"},
        ).json()["data"]
        found = [e for e in events if e["trigger"] and e["summary"]]
        if len(found) >= len(run.points):
            return found
        time.sleep(0.1)
    raise AssertionError(f"{run.marker}: {len(run.points)} points answered, events {len(found)}")


def views(upstream: FakeUpstream) -> dict[tuple[str, int], str]:
    """What the upstream got, by session marker (the task, kept verbatim) and step."""
    found = {}
    for request in upstream.requests:
        if not request.path.endswith("/chat/completions"):
            continue
        body = request.json()
        task = next(TASK.search(m["content"]) for m in body["messages"] if m["role"] == "user")
        assert task is not None
        found[(task.group(1), int(body["messages"][-1]["tool_call_id"][1:]))] = request.body.decode()
    return found


def metric_sums(proxies: list[Any]) -> Counter[str]:
    sums: Counter[str] = Counter()
    pattern = re.compile(r'^(compaction_proxy_prepared_summaries(?:_missed)?_total)\{\w+="([^"]+)"\} (\S+)$')
    for proxy in proxies:
        for line in httpx.get(proxy.url + "/metrics").text.splitlines():
            match = pattern.match(line)
            if match:
                sums[f"{match.group(1)}:{match.group(2)}"] += int(float(match.group(3)))
    return sums


def config(summarizer: SlowSummarizer, redis_url: str) -> dict[str, Any]:
    return {
        "policy": "improved",
        "context_windows": {"default": 8_000},
        "store": {"backend": "redis", "redis_url": redis_url},
        "summarizer": {
            "kind": "openai",
            "model": "small-model",
            "base_url": summarizer.server.base_url,  # keyless, as a local model
            "prepare_at": 0.5,
            "prepare_concurrency": 16,
            "timeout": TIMEOUT,
        },
        "logging": {"level": "warning", "format": "json"},
    }


@dataclass
class Tally:
    """What the points of every session found."""

    outcomes: Counter[str] = field(default_factory=Counter)
    used_at: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # serial -> its points
    later: int = 0  # the healthy sessions' points after their first
    later_used: int = 0


def check_points(
    run: Run, made: list[dict[str, Any]], sent: dict[tuple[str, int], str], tally: Tally
) -> None:
    """The session's points: none called the model itself; each used one preparation, made for
    this session; the failing sessions' points stood on the ledger."""
    assert len(made) == len(run.points) >= 2, (run.marker, run.points, len(made))
    for index, (k, event) in enumerate(zip(run.points, made, strict=True)):
        summary = event["summary"]
        tally.outcomes[summary["prepared"]] += 1
        # Through the never-waiting summarizer (prepared set), which never calls the model.
        assert summary["prepared"] is not None and summary["fallback_reason"] is None, summary
        assert summary["model"] == ("small-model" if summary["prepared"] == "used" else "ledger"), summary
        if summary["prepared"] == "used":
            serials = set(SERIAL.findall(sent[(run.marker, k)]))
            assert len(serials) == 1, (run.marker, k, serials)
            tally.used_at.setdefault(serials.pop(), []).append((run.marker, k))
        if run.number in FAILING:
            assert summary["prepared"] == "none_ready", (run.marker, summary)
        elif index > 0:
            tally.later += 1
            tally.later_used += summary["prepared"] == "used"


def check_metrics(sums: Counter[str], tally: Tally, made: int) -> dict[str, int]:
    """The replicas' counts, summed, are the events' (and the summarizer's); the misses by why."""
    prepared = "compaction_proxy_prepared_summaries_total"
    missed = {
        k.split(":", 1)[1]: v
        for k, v in sums.items()
        if k.startswith("compaction_proxy_prepared_summaries_missed")
    }
    for result in ("used", "none_ready", "stale", "rejected"):
        counted = sum(n for o, n in tally.outcomes.items() if o.split(":")[0] == result)
        assert sums[f"{prepared}:{result}"] == counted, (result, sums, tally.outcomes)
    assert sum(missed.values()) == tally.outcomes["none_ready"], (missed, tally.outcomes)
    assert missed.get("failed", 0) >= 1 and sums[f"{prepared}:failed"] >= 1, (missed, sums)
    assert len(tally.used_at) <= sums[f"{prepared}:prepared"] <= made, (sums, made)
    return missed


def check_redis(store: Any, runs: list[Run], tally: Tally, summarizer: SlowSummarizer) -> int:
    """What Redis keeps: at most one preparation a session (its key), made for that session,
    never one already used, every one expiring; the claims expire within the summarizer's
    timeout. How many preparations are left."""
    for claim in store.scan_iter("cpx:prepping:*"):
        assert 0 < store.ttl(claim) <= TIMEOUT, claim
    keys = {prep_key(run): run.marker for run in runs}
    left = [k.decode() for k in store.scan_iter("cpx:prep:*")]
    for key in left:
        assert key in keys and store.ttl(key) > 0, key
        serials = set(SERIAL.findall(orjson.loads(store.get(key) or b"{}")["result"]["text"]))
        assert len(serials) == 1 and not serials & tally.used_at.keys(), (key, serials)
        assert summarizer.made[serials.pop()] == keys[key], key
    return len(left)


def check_reach(tally: Tally, summarizer: SlowSummarizer) -> None:
    """A session's summaries used at its points reach ever further: none put an older summary,
    of fewer steps, back in place of the one before it."""
    used: dict[str, list[tuple[int, str]]] = {}
    for serial, at in tally.used_at.items():
        for marker, k in at:
            used.setdefault(marker, []).append((k, serial))
    for marker, points in used.items():
        reach = [summarizer.reach[serial] for _, serial in sorted(points)]
        assert reach == sorted(set(reach)), (marker, sorted(points), reach)


def test_prepared_summaries_through_redis_under_load(
    start_proxy: Any, upstream: FakeUpstream, summarizer: SlowSummarizer, redis_url: str
) -> None:
    store = redis.Redis.from_url(redis_url)
    store.flushall()  # the Redis server is shared by the session's tests
    proxies = [start_proxy(config(summarizer, redis_url)) for _ in range(REPLICAS)]
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=TENANTS * PER_TENANT) as pool:
        runs = list(pool.map(lambda n: drive(proxies, Run(n)), range(TENANTS * PER_TENANT)))
    seconds = time.perf_counter() - started
    time.sleep(DELAY + 2.0)  # the preparations still running end (made, or failed after retries)

    assert all(s == 200 for run in runs for s in run.statuses), [run.statuses for run in runs]
    sent = views(upstream)
    tally = Tally()
    for run in runs:
        check_points(run, point_events(proxies[run.number % REPLICAS], run), sent, tally)
        for (marker, _), view in sent.items():
            if marker == run.marker:
                # Only this session's summaries in its views, and only summaries made for it.
                assert set(MARKER.findall(view)) == {run.marker}, (run.marker, set(MARKER.findall(view)))
                assert {summarizer.made[s] for s in SERIAL.findall(view)} <= {run.marker}
    # Each preparation taken once.
    twice = {serial: at for serial, at in tally.used_at.items() if len(at) > 1}
    assert not twice, (len(twice), twice)
    check_reach(tally, summarizer)
    missed = check_metrics(metric_sums(proxies), tally, len(summarizer.made))
    left = check_redis(store, runs, tally, summarizer)
    # One preparation a point: each made was used, or waits in Redis for its session's next.
    wasted = len(summarizer.made) - len(tally.used_at) - left
    assert wasted <= 0.1 * len(summarizer.made), (wasted, len(summarizer.made))

    share = tally.later_used / max(1, tally.later)
    print(
        f"\nunder load: {len(runs)} sessions on {REPLICAS} replicas, {sum(len(r.statuses) for r in runs)} "
        f"requests in {seconds:.1f} s, slowest answer {max(r.slowest for r in runs):.2f} s; points "
        f"{sum(tally.outcomes.values())} {dict(tally.outcomes)}; the healthy sessions' later points used "
        f"{tally.later_used}/{tally.later} ({share:.0%}); missed {missed}; summaries made "
        f"{len(summarizer.made)}, used {len(tally.used_at)}, left in Redis {left}, wasted {wasted}; "
        f"summarizer 500s {summarizer.failed}"
    )
    assert share >= 0.9, share


async def test_redis_prepared_store_contract(redis_url: str) -> None:
    """Taken once (GETDEL), by tenant and session; claimed once per narrative, for a while."""
    backend = RedisStore(redis_url, keep_seconds=3600)
    prepared = RedisPrepared(backend)
    await backend.client.delete("cpx:prep:t_a:s_1", "cpx:prep:t_b:s_1")
    await prepared.put("t_a", "s_1", b"made")
    assert await prepared.take("t_b", "s_1") is None
    assert await prepared.take("t_a", "s_1") == b"made"
    assert await prepared.take("t_a", "s_1") is None
    narrative = f"n{time.time_ns()}"
    assert await prepared.claim("t_a", "s_1", narrative, 30)
    assert not await prepared.claim("t_a", "s_1", narrative, 30)
    assert await prepared.claim("t_b", "s_1", narrative, 30)
    assert 0 < await backend.client.ttl(f"cpx:prepping:t_a:s_1:{narrative}") <= 30
    await backend.close()
