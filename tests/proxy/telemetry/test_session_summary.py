"""The session page's list, summed from events (pure)."""

from __future__ import annotations

from typing import Any

from proxy.config.sections import ModelSettings
from proxy.telemetry.session_summary import PriceColumn, summarize_sessions

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
