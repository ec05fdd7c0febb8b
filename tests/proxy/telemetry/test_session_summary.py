"""The session page's list, summed from events (pure)."""

from __future__ import annotations

from typing import Any

from proxy.config.sections import ModelSettings
from proxy.state.session_rollup import merge, rollup
from proxy.telemetry.session_summary import PriceColumn, SummarizerPrices, summarize_sessions

PRICES = PriceColumn(
    {
        "gpt-4o-mini*": ModelSettings(input_price=0.15),
        "gpt-4o*": ModelSettings(input_price=2.5),
        "default": ModelSettings(window=128_000),
    }
)


def event(session: str, time: float, before: int, after: int, **more: Any) -> dict[str, Any]:
    return {
        "session": session,
        "time": time,
        "tokens_before": before,
        "tokens_after": after,
        "model": "gpt-4o",
        "policy": "improved",
        "dialect": "chat",
        "trigger": None,
        "read_tool_output": None,
        **more,
    }


def test_sessions_are_summed_and_ordered_newest_first() -> None:
    events = [
        event(
            "s_b:improved",
            30.0,
            9000,
            3000,
            trigger="threshold",
            request=7,
            read_tool_output={"rounds": 1, "reads": [{"handle": "out_1"}, {"handle": "out_2"}]},
        ),
        event("s_a:improved", 20.0, 5000, 5000, request=2),
        event("s_b:improved", 10.0, 8000, 2500, request=6),
    ]
    rows = summarize_sessions(events, PRICES)
    assert [r["session"] for r in rows] == ["s_b:improved", "s_a:improved"]
    b = rows[0]
    assert (b["events"], b["requests"], b["compaction_points"], b["reads"]) == (2, 7, 1, 2)
    assert (b["tokens_sent"], b["tokens_upstream"], b["tokens_saved"]) == (17000, 5500, 11500)
    assert b["savings_usd"] == round(11500 * 2.5 / 1e6, 6)
    assert (b["first"], b["last"], b["door"]) == (10.0, 30.0, "chat")


def test_the_first_matching_price_wins_and_an_unpriced_model_shows_none() -> None:
    assert PRICES.per_million("gpt-4o-mini-2024") == 0.15 and PRICES.per_million("gpt-4o") == 2.5
    rows = summarize_sessions([event("s_c:full", 1.0, 100, 50, model="claude-x")], PRICES)
    assert rows[0]["savings_usd"] is None and rows[0]["requests"] == 1


def test_the_list_is_cut_at_the_limit() -> None:
    events = [event(f"s_{i}:p", float(i), 1, 1) for i in range(10)]
    assert [r["session"] for r in summarize_sessions(events, PRICES, limit=3)] == ["s_9:p", "s_8:p", "s_7:p"]


def test_a_row_carries_the_clients_own_session_id() -> None:
    events = [
        event("s_a:improved", 1.0, 100, 50),  # recorded before the id was kept
        event("s_a:improved", 2.0, 100, 50, client_session="run-1"),
        event("s_b:improved", 3.0, 100, 50),
    ]
    rows = {row["session"]: row for row in summarize_sessions(events, PRICES)}
    assert rows["s_a:improved"]["client_session"] == "run-1"
    assert rows["s_b:improved"]["client_session"] is None


def test_the_savings_are_net_of_the_compaction_own_cost() -> None:
    """The summarizer's tokens, of points and preparations, are summed per session, priced at
    the summarizer model's prices and taken off what the prompt tokens saved."""
    own = {"input_tokens": 100_000, "output_tokens": 10_000}
    events = [
        event("s_d:improved", 1.0, 9000, 3000, trigger="threshold", compaction_cost=own, arm="treated"),
        event("s_d:improved", 2.0, 9500, 3500, compaction_cost={"input_tokens": 50_000, "output_tokens": 0}),
        event("s_e:improved", 3.0, 100, 100),  # a row with no own cost: 0 tokens, 0 dollars
    ]
    rows = {
        r["session"]: r for r in summarize_sessions(events, PRICES, summarizer=SummarizerPrices(0.15, 0.6))
    }
    d = rows["s_d:improved"]
    assert (d["compaction_input_tokens"], d["compaction_output_tokens"], d["arm"]) == (
        150_000,
        10_000,
        "treated",
    )
    gross = 12_000 * 2.5 / 1e6
    spent = (150_000 * 0.15 + 10_000 * 0.6) / 1e6
    assert d["prompt_savings_usd"] == round(gross, 6) and d["compaction_cost_usd"] == round(spent, 6)
    assert d["savings_usd"] == round(gross - spent, 6)
    e = rows["s_e:improved"]
    assert (e["compaction_cost_usd"], e["savings_usd"], e["arm"]) == (0.0, 0.0, None)


def test_an_unpriced_summarizer_leaves_the_net_savings_unknown() -> None:
    events = [event("s_f:improved", 1.0, 900, 300, compaction_cost={"input_tokens": 10, "output_tokens": 1})]
    (row,) = summarize_sessions(events, PRICES)
    assert row["prompt_savings_usd"] == round(600 * 2.5 / 1e6, 6)
    assert row["compaction_cost_usd"] is None and row["savings_usd"] is None


def test_a_row_kept_before_the_own_cost_was_summed_merges_as_zero() -> None:
    old = rollup("s_g:improved", event("s_g:improved", 1.0, 900, 300))
    for name in ("compaction_input_tokens", "compaction_output_tokens", "arm"):
        del old[name]
    new = rollup("s_g:improved", event("s_g:improved", 2.0, 900, 300, compaction_cost={"input_tokens": 7}))
    assert merge(old, new)["compaction_input_tokens"] == 7
