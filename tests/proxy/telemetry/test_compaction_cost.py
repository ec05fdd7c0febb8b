"""The compaction's own cost: a point's summarizer tokens on its request's event, each
preparation's on an event of its own (never on a request's: each spend on exactly one event),
and their price (pure)."""

from __future__ import annotations

import time

from policies.facts import StageFacts, SummaryFact
from policies.pipeline import PolicyOutcome
from proxy.telemetry.compaction_cost import (
    PREPARATION,
    CompactionCost,
    Preparation,
    Preparations,
    PreparedFor,
    cost_tokens,
    own_cost,
    point_tokens,
    preparation_event,
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


def test_a_request_carries_its_point_only_never_a_preparation() -> None:
    point = exchange("s_1:improved", summary())
    CompactionCost().finish(point)
    assert point.compaction_cost == {
        "input_tokens": 900,
        "output_tokens": 120,
        "point": {"input_tokens": 900, "output_tokens": 120},
        "preparation": {"input_tokens": 0, "output_tokens": 0},
    }
    used = exchange("s_1:improved", summary(prepared="used"))
    CompactionCost().finish(used)
    assert used.compaction_cost is None  # its preparation paid, on the preparation's own event


def whose() -> PreparedFor:
    return PreparedFor(
        arm="treated", canary_key="t_a\x1fk", policy="improved", mode="enforce", door="chat",
        client_session=b"my-run\n1", model="gpt-4o",
    )  # fmt: skip


def test_a_preparation_gets_its_own_event_which_is_no_request() -> None:
    event = preparation_event(Preparation("t_a", "s_1:improved", whose(), 700, 70))
    assert event["kind"] == PREPARATION and event["schema_version"] == 1
    assert event["event_id"].startswith("ev_") and event["tenant"] == "t_a"
    assert event["session"] == "s_1:improved" and event["policy"] == "improved"
    assert (event["model"], event["mode"], event["dialect"], event["arm"]) == (
        "gpt-4o",
        "enforce",
        "chat",
        "treated",
    )
    assert event["client_session"] == "my-run?1"  # shown as a request's event shows it
    assert event["trigger"] is None and event["request"] is None and "tokens_before" not in event
    assert event["compaction_cost"] == {
        "input_tokens": 700,
        "output_tokens": 70,
        "point": {"input_tokens": 0, "output_tokens": 0},
        "preparation": {"input_tokens": 700, "output_tokens": 70},
    }
    outside = preparation_event(Preparation("t_a", "s_1:improved", PreparedFor(), 1, 1))
    assert "arm" not in outside and "client_session" not in outside


def test_each_spend_is_on_exactly_one_event() -> None:
    """A session's points and preparations, interleaved: what its events carry adds up to what
    was spent, once (a preparation finished before a point is not carried by it too)."""
    recorded: list[dict[str, object]] = []
    preparations = Preparations()
    preparations.listeners.append(lambda done: recorded.append(preparation_event(done)))
    events: list[object] = []
    preparations.finished(Preparation("t_a", "s_1:improved", whose(), 700, 70))
    for fact in (summary(), summary(prepared="used"), None):
        request = exchange("s_1:improved", fact)
        CompactionCost().finish(request)
        events.append(request.compaction_cost)
        preparations.finished(Preparation("t_a", "s_1:improved", whose(), 500, 50))
    events += [e["compaction_cost"] for e in recorded]
    spent = (900 + 700 + 3 * 500, 120 + 70 + 3 * 50)
    assert tuple(map(sum, zip(*(cost_tokens(e) for e in events), strict=True))) == spent
    assert len(recorded) == 4


def test_a_failed_listener_costs_the_others_nothing_and_nothing_spent_is_not_recorded() -> None:
    failures: list[tuple[str, str]] = []

    class Log:
        def warning(self, event: str, error: str) -> None:
            failures.append((event, error))

    preparations = Preparations(Log())
    got: list[Preparation] = []

    def broken(done: Preparation) -> None:
        raise RuntimeError("book away")

    preparations.listeners += [broken, got.append]
    preparations.finished(Preparation("t_a", "s_1:improved", whose(), 0, 0))
    assert got == [] and failures == []
    preparations.finished(Preparation("t_a", "s_1:improved", whose(), 5, 1))
    assert len(got) == 1 and failures == [("preparation_record_failed", "RuntimeError")]


def test_the_cost_is_priced_at_the_summarizer_prices() -> None:
    assert priced_usd(1_000_000, 100_000, 0.15, 0.6) == 0.15 + 0.06
    assert priced_usd(1_000_000, 100_000, 0.15, None) == 0.15 + 0.06  # output at 4x the input
    assert priced_usd(10, 1, None, None) is None  # spent, with no price: unknown
    assert priced_usd(0, 0, None, None) == 0.0  # nothing spent costs nothing
    assert cost_tokens(own_cost((3, 1), (4, 2))) == (7, 3) and cost_tokens(None) == (0, 0)
