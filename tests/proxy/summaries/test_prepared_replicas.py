"""Summaries prepared ahead by processes on one store (replicas on Redis, workers on SQLite):
each preparation used once, by whichever serves the point; a replica that did not serve the
last point prepares the next; one written on an older narrative is stale; one process, the
first to claim it, prepares a session's next point."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

from policies.facts import StageFacts, TriggerFact
from policies.pipeline import Checkpoint, PolicyOutcome
from policies.summarizer import SummaryRequest, SummaryResult
from proxy.state.sqlite_store import SQLiteStore
from proxy.summaries.prepared import NeverWaiting, PreparedSummaries
from proxy.summaries.prepared_store import SQLitePrepared
from tests.proxy.summaries.test_prepared import count, request, summary


class Store:
    """The shared store of replicas: ``take`` reads and removes (Redis GETDEL); ``away``: it
    fails every call."""

    def __init__(self, away: str = "") -> None:
        self.kept: dict[tuple[str, str], bytes] = {}
        self.claims: set[tuple[str, str, str]] = set()
        self.away = away

    async def put(self, tenant: str, session: str, data: bytes) -> None:
        if self.away in ("put", "both"):
            raise ConnectionError("store away")
        self.kept[(tenant, session)] = data

    async def take(self, tenant: str, session: str) -> bytes | None:
        if self.away in ("take", "both"):
            raise ConnectionError("store away")
        return self.kept.pop((tenant, session), None)

    async def claim(self, tenant: str, session: str, built_on: str, seconds: float) -> bool:
        if self.away == "both":
            raise ConnectionError("store away")
        claimed = (tenant, session, built_on) in self.claims
        self.claims.add((tenant, session, built_on))
        return not claimed


class Steps:
    """A summarizer whose summary says how many messages it was asked about."""

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        steps = len(request.covered_digests)
        return SummaryResult(
            text=f"The agent ran pytest {steps} times.", model="m", prompt_family="hybrid_v2"
        )


async def prepared_by(replica: PreparedSummaries, digests: tuple[str, ...]) -> None:
    replica.start("t", "s", request(digests), Steps())
    await replica.queue.idle()


async def test_a_summary_another_replica_took_is_never_used_again() -> None:
    """Replica A prepares; B serves the next point and takes it from the store. A's own copy
    of it is not used at a later point A serves: that preparation was taken once."""
    store = Store()
    a, b = (PreparedSummaries(max_tokens=500, count=count, shared=store) for _ in range(2))
    await prepared_by(a, ("a", "b"))
    taken = await NeverWaiting(b, "t", "s", Steps()).summarize(request(("a", "b", "c")))
    assert taken.prepared == "used" and taken.text == "The agent ran pytest 2 times."
    later = await NeverWaiting(a, "t", "s", Steps()).summarize(request(("a", "b", "c", "d", "e")))
    assert later.prepared == "none_ready" and later.model == "ledger"


async def test_a_newer_range_another_replica_prepared_beats_this_ones_copy() -> None:
    store = Store()
    a, b = (PreparedSummaries(max_tokens=500, count=count, shared=store) for _ in range(2))
    await prepared_by(a, ("a", "b"))
    await prepared_by(b, ("a", "b", "c"))
    used = await NeverWaiting(a, "t", "s", Steps()).summarize(request(("a", "b", "c", "d")))
    assert used.prepared == "used" and used.text == "The agent ran pytest 3 times."
    assert store.kept == {}


async def test_with_the_store_away_a_replica_uses_its_own_copy() -> None:
    for away in ("put", "take", "both"):
        results: list[str] = []
        replica = PreparedSummaries(max_tokens=500, count=count, shared=Store(away), counted=results.append)
        await prepared_by(replica, ("a", "b"))
        used = await NeverWaiting(replica, "t", "s", Steps()).summarize(request(("a", "b", "c")))
        assert used.prepared == "used", away
        assert ("unshared" in results) == (away != "take"), (away, results)


class SlowStore(Store):
    """A store whose writes start (``writing``) and wait until ``written`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.writing, self.written = asyncio.Event(), asyncio.Event()

    async def put(self, tenant: str, session: str, data: bytes) -> None:
        self.writing.set()
        await self.written.wait()
        await super().put(tenant, session, data)


async def test_a_summary_is_not_used_while_it_is_being_stored() -> None:
    """A point on the preparing replica while the summary is on its way to the store: used
    there, it would land in the store afterwards, for another replica's point to use again."""
    store = SlowStore()
    a, b = (PreparedSummaries(max_tokens=500, count=count, shared=store) for _ in range(2))
    a.start("t", "s", request(("a", "b")), Steps())
    await store.writing.wait()  # summarized, now on its way to the store
    now = await NeverWaiting(a, "t", "s", Steps()).summarize(request(("a", "b", "c")))
    store.written.set()
    await a.queue.idle()
    later = await NeverWaiting(b, "t", "s", Steps()).summarize(request(("a", "b", "c", "d")))
    assert [now.prepared, later.prepared] == ["none_ready", "used"]


def between_points(compactions: int, tokens: int) -> PolicyOutcome:
    """A request past the mark (0.5 of an 8k window) between points, ``compactions`` so far."""
    trigger = TriggerFact(tokens=tokens, threshold=6000, window=8000, request_tokens=tokens)
    return PolicyOutcome(
        None,
        tokens,
        tokens,
        checkpoint=Checkpoint(compactions=compactions),
        facts=StageFacts(trigger=trigger),
    )


def dry_run(
    digests: tuple[str, ...] | None, previous: str | None = None
) -> Callable[[Checkpoint], Awaitable[SummaryRequest | None]]:
    """The summary request of a dry run: of ``digests`` after the summary ``previous``."""

    async def run(_: Checkpoint) -> SummaryRequest | None:
        return replace(request(digests), previous_summary=previous) if digests else None

    return run


async def past_the_mark(
    replica: PreparedSummaries, compactions: int, tokens: int, digests: tuple[str, ...], previous: str | None
) -> None:
    """A request past the mark on ``replica``: its dry run, and the preparation it starts."""
    task = replica.after_request(
        "t", "s", between_points(compactions, tokens), Steps(), dry_run(digests, previous), 0.5
    )
    assert task is not None
    await task
    await replica.queue.idle()


async def test_a_replica_prepares_again_once_another_served_the_point() -> None:
    """Replica A prepared for the session's point, which B served (taking it from the store).
    Past the mark before the next point, A prepares again: its copy of what B took, and the
    size its last dry run tried, are the last cycle's."""
    store = Store()
    a, b = (PreparedSummaries(max_tokens=500, count=count, shared=store) for _ in range(2))
    await past_the_mark(a, 0, 5000, ("a", "b"), None)
    taken = await NeverWaiting(b, "t", "s", Steps()).summarize(request(("a", "b", "c")))
    assert taken.prepared == "used"
    # The point compacted the view: the next request is smaller than the last dry run's.
    await past_the_mark(a, 1, 4200, ("a", "b", "c", "d"), summary(taken.text))
    following = replace(request(("a", "b", "c", "d", "e")), previous_summary=summary(taken.text))
    used = await NeverWaiting(b, "t", "s", Steps()).summarize(following)
    assert used.prepared == "used" and used.text == "The agent ran pytest 4 times."


async def test_a_dry_run_that_found_nothing_is_tried_again_in_the_next_cycle() -> None:
    store = Store()
    a, b = (PreparedSummaries(max_tokens=500, count=count, shared=store) for _ in range(2))
    nothing = a.after_request("t", "s", between_points(0, 5000), Steps(), dry_run(None), 0.5)
    assert nothing is not None
    await nothing
    assert a.after_request("t", "s", between_points(0, 5100), Steps(), dry_run(None), 0.5) is None
    await NeverWaiting(b, "t", "s", Steps()).summarize(request(("a", "b")))  # B's point
    await b.queue.idle()
    again = a.after_request("t", "s", between_points(1, 4200), Steps(), dry_run(("a", "b")), 0.5)
    assert again is not None
    await again
    await a.queue.idle()


async def test_a_preparation_landing_after_a_newer_point_is_not_used() -> None:
    """Replicas B and C both prepared the session's next point from the same summary; A's point
    used B's, then C's lands in the store. The next point has B's narrative in its summary:
    C's, written without it, would put the older one back."""
    store = Store()
    a, b, c = (PreparedSummaries(max_tokens=500, count=count, shared=store) for _ in range(3))
    await prepared_by(b, ("a", "b"))
    used = await NeverWaiting(a, "t", "s", Steps()).summarize(request(("a", "b", "c")))
    assert used.prepared == "used"
    await prepared_by(c, ("a", "b", "c"))
    following = replace(request(("a", "b", "c", "d")), previous_summary=summary(used.text))
    late = await NeverWaiting(a, "t", "s", Steps()).summarize(following)
    assert late.prepared == "stale" and late.model == "ledger"


async def test_one_replica_prepares_the_next_point_the_first_to_claim_it() -> None:
    """Past the mark on A, then on B and C before the point: A alone asks the summarizer (each
    would pay for the same range, and the last to land would replace the first). Once a point
    used it, the next point's summary is written on a new narrative: claimed afresh."""
    store = Store()
    a, b, c = (PreparedSummaries(max_tokens=500, count=count, shared=store) for _ in range(3))
    await past_the_mark(a, 0, 4100, ("a", "b"), None)
    await past_the_mark(b, 0, 4500, ("a", "b", "c"), None)
    await past_the_mark(c, 0, 4900, ("a", "b", "c", "d"), None)
    taken = await NeverWaiting(c, "t", "s", Steps()).summarize(request(("a", "b", "c", "d", "e")))
    assert taken.prepared == "used" and taken.text == "The agent ran pytest 2 times."
    await past_the_mark(b, 1, 4100, ("a", "b", "c", "d", "e", "f"), summary(taken.text))
    following = replace(request(("a", "b", "c", "d", "e", "f", "g")), previous_summary=summary(taken.text))
    used = await NeverWaiting(a, "t", "s", Steps()).summarize(following)
    assert used.prepared == "used" and used.text == "The agent ran pytest 6 times."


async def test_a_point_that_found_nothing_ready_prepares_despite_the_claim() -> None:
    store = Store()
    a, b = (PreparedSummaries(max_tokens=500, count=count, shared=store) for _ in range(2))
    await store.claim("t", "s", "", 60)  # another replica's preparation, failed or still running
    missed = await NeverWaiting(a, "t", "s", Steps()).summarize(request(("a", "b")))
    assert missed.prepared == "none_ready" and a.running("s")
    await a.queue.idle()
    used = await NeverWaiting(b, "t", "s", Steps()).summarize(request(("a", "b", "c")))
    assert used.prepared == "used"


def test_sqlite_claims_once_per_narrative_until_it_expires(tmp_path: Path) -> None:
    async def run() -> None:
        store = SQLiteStore(tmp_path / "store.db")
        here, there = SQLitePrepared(store), SQLitePrepared(store)
        assert await here.claim("t", "s", "n1", 60)
        assert not await there.claim("t", "s", "n1", 60)
        assert await there.claim("t", "s", "n2", 60) and await there.claim("t", "other", "n1", 60)
        assert await here.claim("t", "s", "n3", -1)  # expired at once
        assert await there.claim("t", "s", "n3", 60)
        await here.put("t", "s", b"made")
        assert await there.take("t", "s") == b"made" and await here.take("t", "s") is None
        await store.close()

    asyncio.run(run())
