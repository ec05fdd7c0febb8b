"""The compaction's own cost: a point's summarizer tokens, the preparations' kept per session
until its next request, and their price (pure)."""

from __future__ import annotations

import time

from policies.facts import StageFacts, SummaryFact
from policies.pipeline import PolicyOutcome
from proxy.telemetry.compaction_cost import (
    CompactionCost,
    PreparationSpend,
    cost_tokens,
    own_cost,
    point_tokens,
    priced_usd,
)
from proxy.telemetry.exchange import Exchange


def summary(model: str = "small", prepared: str | None = None) -> SummaryFact:
    return SummaryFact(
        model=model, prompt_family="hybrid", input_tokens=900, output_tokens=120, prepared=prepared
    )


def exchange(session: str, fact: SummaryFact | None) -> Exchange:
    made = Exchange(request_id="r", route="chat", method="POST", started=time.perf_counter())
    made.session = session
    made.outcome = PolicyOutcome(
        None, 10, 5, facts=StageFacts(summary=fact), trigger="threshold" if fact else None
    )
    return made


def test_a_point_pays_for_the_summary_it_made_not_for_a_prepared_one_or_the_ledger() -> None:
    assert point_tokens(summary()) == (900, 120)
    assert point_tokens(summary(prepared="used")) == (0, 0)  # its preparation paid, counted then
    assert point_tokens(summary(model="ledger", prepared="none_ready")) == (0, 0)
    assert point_tokens(None) == (0, 0)


def test_preparations_wait_for_the_session_and_are_taken_once() -> None:
    spend = PreparationSpend(sessions=2)
    spend.add("a", 500, 50)
    spend.add("a", 400, 40)  # a second preparation (one went stale) adds up
    spend.add("b", 0, 0)  # nothing spent: nothing kept
    assert spend.pending("a") and not spend.pending("b")
    assert spend.take("a") == (900, 90) and spend.take("a") == (0, 0)
    for session in ("x", "y", "z"):
        spend.add(session, 1, 1)
    assert not spend.pending("x")  # bounded: the oldest dropped


def test_the_finisher_adds_the_point_and_the_preparations_since_the_last_request() -> None:
    spend = PreparationSpend()
    spend.add("s_1:improved", 700, 70)
    point = exchange("s_1:improved", summary())
    CompactionCost(spend).finish(point)
    assert point.compaction_cost == {
        "input_tokens": 1600,
        "output_tokens": 190,
        "point": {"input_tokens": 900, "output_tokens": 120},
        "preparation": {"input_tokens": 700, "output_tokens": 70},
    }
    after = exchange("s_1:improved", None)
    CompactionCost(spend).finish(after)
    assert after.compaction_cost is None  # taken once: the next request has nothing to carry


def test_a_request_of_another_session_takes_nothing_of_this_one() -> None:
    spend = PreparationSpend()
    spend.add("s_1:improved", 700, 70)
    other = exchange("s_2:improved", summary(prepared="used"))
    CompactionCost(spend).finish(other)
    assert other.compaction_cost is None and spend.pending("s_1:improved")


def test_the_cost_is_priced_at_the_summarizer_prices() -> None:
    assert priced_usd(1_000_000, 100_000, 0.15, 0.6) == 0.15 + 0.06
    assert priced_usd(1_000_000, 100_000, 0.15, None) == 0.15 + 0.06  # output at 4x the input
    assert priced_usd(10, 1, None, None) is None  # spent, with no price: unknown
    assert priced_usd(0, 0, None, None) == 0.0  # nothing spent costs nothing
    assert cost_tokens(own_cost((3, 1), (4, 2))) == (7, 3) and cost_tokens(None) == (0, 0)
