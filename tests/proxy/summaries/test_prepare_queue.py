"""Preparations served fairly: one bound per process, round-robin by tenant, newest range first
within a tenant, bounded queues; and what a point that found nothing ready is counted as.

The summarizer is a fake whose calls end when the test says (``tick``: one summarizer period,
a 2 s summarizer without sleeping)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from policies.summarizer import SummaryRequest, SummaryResult
from proxy.config.settings import ConfigError, load_settings
from proxy.summaries.prepared import NeverWaiting, PreparedSummaries
from proxy.telemetry.metrics import Metrics
from tests.proxy.summaries.test_prepared import count, request


class Gated:
    """A summarizer whose calls end together at each ``tick``; it records the order of its
    calls (by the first digest of the range) and the most in flight at once."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.gates: list[asyncio.Event] = []
        self.in_flight = 0
        self.most = 0

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.calls.append(request.covered_digests[-1])
        gate = asyncio.Event()
        self.gates.append(gate)
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await gate.wait()
        finally:
            self.in_flight -= 1
        return SummaryResult(
            text="The agent ran pytest on src/parser.py.", model="gated", prompt_family="hybrid_v2"
        )

    async def tick(self) -> None:
        """Every call in flight ends; the slots they free start the next ones."""
        await self.settle()
        gates, self.gates = self.gates, []
        for gate in gates:
            gate.set()
        await self.settle()

    async def settle(self) -> None:
        for _ in range(10):
            await asyncio.sleep(0)

    async def finish(self) -> None:
        await self.settle()
        while self.gates:
            await self.tick()


def manager(concurrency: int = 2, queue: int = 400) -> tuple[PreparedSummaries, list[str], list[str]]:
    results: list[str] = []
    missed: list[str] = []
    summaries = PreparedSummaries(
        max_tokens=500,
        count=count,
        concurrency=concurrency,
        queue=queue,
        counted=results.append,
        missed=missed.append,
    )
    return summaries, results, missed


async def test_one_tenants_300_sessions_do_not_hold_up_another_tenants_point() -> None:
    summaries, results, missed = manager(concurrency=2)
    model = Gated()
    for n in range(300):
        summaries.start("big", f"big{n}", request((f"big{n}",)), model)
    summaries.start("small", "small", request(("small",)), model)
    await model.tick()
    # The first turn went to the big tenant (it came first), the next free slot to the small one.
    assert "small" in model.calls[:4]
    await model.tick()
    point = NeverWaiting(summaries, "small", "small", model)
    used = await point.summarize(request(("small", "more")))
    assert used.prepared == "used" and used.model == "gated"
    # The big tenant's sessions are all prepared in time (none skipped), never more than 2 at once.
    await model.finish()
    assert sorted(model.calls) == sorted([*(f"big{n}" for n in range(300)), "small"])
    assert model.most == 2 and summaries.queue.in_flight == 0 and summaries.queue.queued == 0
    assert results.count("prepared") == 301 and missed == []


async def test_within_a_tenant_the_newest_range_goes_first() -> None:
    summaries, _, _ = manager(concurrency=1)
    model = Gated()
    for n in range(5):
        summaries.start("t", f"s{n}", request((f"s{n}",)), model)
    for _ in range(5):
        await model.tick()
    # s0 started at once (a free slot); then the newest waiting first.
    assert model.calls == ["s0", "s4", "s3", "s2", "s1"]


async def test_tenants_take_turns_whatever_their_backlog() -> None:
    summaries, _, _ = manager(concurrency=1)
    model = Gated()
    for n in range(3):
        summaries.start("a", f"a{n}", request((f"a{n}",)), model)
    summaries.start("b", "b0", request(("b0",)), model)
    summaries.start("c", "c0", request(("c0",)), model)
    await model.finish()
    assert model.calls == ["a0", "a2", "b0", "c0", "a1"]


async def test_a_newer_range_of_a_session_replaces_the_one_waiting() -> None:
    summaries, results, _ = manager(concurrency=1)
    model = Gated()
    summaries.start("t", "busy", request(("busy",)), model)
    summaries.start("t", "s", request(("old",)), model)
    summaries.start("t", "s", request(("old", "new")), model)
    await model.finish()
    assert model.calls == ["busy", "new"] and results.count("superseded") == 1


async def test_a_full_queue_drops_its_oldest_and_that_sessions_point_says_so() -> None:
    summaries, results, missed = manager(concurrency=1, queue=2)
    model = Gated()
    for n in range(4):  # s0 runs; s1, s2, s3 wait in a queue of 2: s1 is dropped
        summaries.start("t", f"s{n}", request((f"s{n}",)), model)
    assert results == ["dropped"] and summaries.queue.queued == 2
    point = NeverWaiting(summaries, "t", "s1", model)
    ledger = await point.summarize(request(("s1", "more")))
    assert ledger.model == "ledger" and ledger.prepared == "none_ready"
    assert missed == ["dropped"]
    # The point's own range is queued for the next point (and, newest, pushes out s2).
    assert summaries.queue.state("s1") == "queued" and results.count("dropped") == 2
    await summaries.drain()


async def test_a_point_that_finds_nothing_ready_is_counted_with_why() -> None:
    summaries, _, missed = manager(concurrency=1)
    model = Gated()
    summaries.start("t", "running", request(("running",)), model)
    summaries.start("t", "queued", request(("queued",)), model)
    for session in ("running", "queued", "never"):
        point = NeverWaiting(summaries, "t", session, model)
        assert (await point.summarize(request((session, "more")))).prepared == "none_ready"
    assert missed == ["running", "queued", "none"]
    # The queued one gave way to its point's newer range; the running one was kept.
    assert summaries.queue.state("queued") == "queued" and summaries.queue.job("queued") is not None
    await summaries.drain()


async def test_the_miss_and_queue_depth_metrics() -> None:
    metrics = Metrics()
    summaries = PreparedSummaries(
        max_tokens=500,
        count=count,
        concurrency=1,
        missed=lambda reason: metrics.prepared_summaries_missed.labels(reason).inc(),
        depth=metrics.prepared_summaries_queued.set,
    )
    model = Gated()
    summaries.start("t", "a", request(("a",)), model)
    summaries.start("t", "b", request(("b",)), model)
    await NeverWaiting(summaries, "t", "b", model).summarize(request(("b", "c")))
    text = metrics.render().decode()
    assert 'compaction_proxy_prepared_summaries_missed_total{reason="queued"} 1.0' in text
    assert "compaction_proxy_prepared_summaries_queued 1.0" in text
    await summaries.drain()
    assert "compaction_proxy_prepared_summaries_queued 0.0" in metrics.render().decode()


def test_the_bounds_are_validated_at_start_up(tmp_path: Path) -> None:
    for key, value in (("prepare_concurrency", 0), ("prepare_queue", 0)):
        path = tmp_path / "config.yml"
        path.write_text(f"summarizer:\n  {key}: {value}\n")
        try:
            load_settings(path, env={})
        except ConfigError as error:
            assert f"summarizer.{key}" in str(error)
        else:
            raise AssertionError(f"{key}: {value} was accepted")
