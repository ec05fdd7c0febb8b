"""Summaries prepared ahead: the checks before use, and the manager (pure asyncio, no HTTP)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace

from policies.facts import StageFacts, TriggerFact
from policies.ledger import LEDGER_HEADING, CommandRecord, FileRecord, Ledger
from policies.pipeline import Checkpoint, PolicyOutcome
from policies.stages.common import summary_content
from policies.summarizer import SummaryRequest, SummaryResult
from proxy.summaries.prepared import NeverWaiting, PreparedSummaries
from proxy.summaries.prepared_checks import Prepared, check, lineage

LEDGER = Ledger(
    goal="Fix the parser in src/parser.py",
    files=(FileRecord(path="src/parser.py", views=2),),
    commands=(CommandRecord(command="pytest tests/test_parser.py", exit_code=1),),
    errors=("ValueError: bad token in parse_header",),
    handles=("out_0123456789abcdef",),
)


def request(digests: tuple[str, ...], start: int = 2) -> SummaryRequest:
    return SummaryRequest(
        previous_summary=None,
        messages=[],
        ledger=LEDGER,
        covered=(start, start + len(digests)),
        covered_digests=digests,
    )


def prepared(text: str, digests: tuple[str, ...] = ("a", "b"), start: int = 2) -> Prepared:
    return Prepared(start, digests, SummaryResult(text=text, model="m", prompt_family="hybrid_v2"), 0.0)


def count(text: str) -> int:
    return len(text.split())


def test_a_summary_of_a_prefix_of_the_range_passes() -> None:
    text = (
        "The agent read src/parser.py, ran pytest and saw ValueError in parse_header (out_0123456789abcdef)."
    )
    assert check(prepared(text), request(("a", "b", "c", "d")), 500, count) is None


def test_a_changed_or_branched_conversation_makes_it_stale() -> None:
    assert check(prepared("ok"), request(("a", "X", "c")), 500, count) == "stale"
    assert check(prepared("ok"), request(("a", "b", "c"), start=4), 500, count) == "stale"
    assert check(prepared("ok", ("a", "b", "c")), request(("a", "b")), 500, count) == "stale"


def summary(narrative: str, ledger: str = "- messages 2-9: handle=out_5d30d24b6338da4f") -> str:
    """A summary message's content: the model's narrative, then the ledger."""
    return summary_content(narrative, f"{LEDGER_HEADING}\n{ledger}")


def test_a_summary_written_before_the_current_narrative_is_stale() -> None:
    """Prepared for an earlier point (another replica's, landing late): it would put an older
    narrative in place of the one the summary has now. One written on the same narrative passes,
    also when a ledger-only point kept that narrative in between."""
    text = "The agent ran pytest on src/parser.py."
    now = replace(request(("a", "b", "c")), previous_summary=summary("The agent read src/parser.py."))
    assert check(prepared(text), now, 500, count) == "stale"
    on_it = replace(prepared(text), built_on=lineage(summary("The agent read src/parser.py.", "- other")))
    assert check(on_it, now, 500, count) is None
    assert lineage(summary("")) == lineage(None) == ""


def test_what_the_ledger_does_not_know_or_spells_otherwise_is_rejected() -> None:
    digests = ("a", "b", "c")
    handle = check(prepared("Read out_fedcba9876543210 for details."), request(digests), 500, count)
    assert handle == "rejected: names handle out_fedcba9876543210, which the ledger does not know"
    file = check(prepared("The fix is in src/lexer.py."), request(digests), 500, count)
    assert file == "rejected: names file src/lexer.py, which the ledger does not know"
    spelled = check(prepared("The error came from Parse_Header."), request(digests), 500, count)
    assert spelled == "rejected: spells parse_header as Parse_Header"
    assert check(prepared("word " * 600), request(digests), 500, count) == "rejected: over the summary budget"


class SlowSummarizer:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.calls = 0

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.calls += 1
        await asyncio.sleep(self.seconds)
        return SummaryResult(
            text="The agent ran pytest on src/parser.py.", model="slow", prompt_family="hybrid_v2"
        )


async def test_a_point_never_waits_and_the_next_uses_what_was_prepared() -> None:
    results: list[str] = []
    summaries = PreparedSummaries(max_tokens=500, count=count, counted=results.append)
    model = SlowSummarizer(0.3)
    point = NeverWaiting(summaries, "t", "s", model)
    started = asyncio.get_running_loop().time()
    first = await point.summarize(request(("a", "b")))
    assert asyncio.get_running_loop().time() - started < 0.05
    assert first.model == "ledger" and first.prepared == "none_ready" and summaries.running("s")
    await summaries.queue.idle()
    second = await point.summarize(request(("a", "b", "c", "d")))
    assert second.model == "slow" and second.prepared == "used" and second.text.startswith("The agent")
    assert results == ["none_ready", "prepared", "used"] and model.calls == 1


async def test_a_replay_point_settles_the_preparation_in_flight() -> None:
    """With ``X-Compaction-Prepared: wait`` (the replay's header) a point takes what its
    preparation makes, however fast the requests come: the same decisions every run."""
    results: list[str] = []
    summaries = PreparedSummaries(max_tokens=500, count=count, counted=results.append)
    model = SlowSummarizer(0.2)
    summaries.start("t", "s", request(("a", "b")), model)
    waiting = NeverWaiting(summaries, "t", "s", model, wait=True)
    used = await waiting.summarize(request(("a", "b", "c")))
    assert used.prepared == "used" and used.model == "slow"


class Store:
    """The shared store of replicas: ``take`` reads and removes (Redis GETDEL); ``away``: it
    fails every call."""

    def __init__(self, away: str = "") -> None:
        self.kept: dict[tuple[str, str], bytes] = {}
        self.away = away

    async def put(self, tenant: str, session: str, data: bytes) -> None:
        if self.away in ("put", "both"):
            raise ConnectionError("store away")
        self.kept[(tenant, session)] = data

    async def take(self, tenant: str, session: str) -> bytes | None:
        if self.away in ("take", "both"):
            raise ConnectionError("store away")
        return self.kept.pop((tenant, session), None)


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


def dry_run(digests: tuple[str, ...] | None) -> Callable[[Checkpoint], Awaitable[SummaryRequest | None]]:
    async def run(_: Checkpoint) -> SummaryRequest | None:
        return request(digests) if digests else None

    return run


async def test_a_replica_prepares_again_once_another_served_the_point() -> None:
    """Replica A prepared for the session's point, which B served (taking it from the store).
    Past the mark before the next point, A prepares again: its copy of what B took, and the
    size its last dry run tried, are the last cycle's."""
    store = Store()
    a, b = (PreparedSummaries(max_tokens=500, count=count, shared=store) for _ in range(2))
    first = a.after_request("t", "s", between_points(0, 5000), Steps(), dry_run(("a", "b")), 0.5)
    assert first is not None
    await first
    await a.queue.idle()
    taken = await NeverWaiting(b, "t", "s", Steps()).summarize(request(("a", "b", "c")))
    assert taken.prepared == "used"
    # The point compacted the view: the next request is smaller than the last dry run's.
    again = a.after_request("t", "s", between_points(1, 4200), Steps(), dry_run(("a", "b", "c", "d")), 0.5)
    assert again is not None
    await again
    await a.queue.idle()
    used = await NeverWaiting(b, "t", "s", Steps()).summarize(request(("a", "b", "c", "d", "e")))
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
