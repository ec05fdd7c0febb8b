"""The sessions list from summaries kept as events are written, read off the data plane's
store thread: the same rows as summing the events, bounded work per call."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

from proxy.config.sections import ModelSettings
from proxy.state.sqlite_store import SQLiteStore
from proxy.telemetry.session_summary import PriceColumn, priced, summarize_sessions

PRICES = PriceColumn({"gpt-4o*": ModelSettings(input_price=2.5), "default": ModelSettings(window=1000)})


def event(i: int, session: str, **more: Any) -> dict[str, Any]:
    return {
        "event_id": f"e{i}",
        "session": session,
        "time": float(i),
        "policy": session.split(":")[1],
        "tokens_before": 1000 + i,
        "tokens_after": 400,
        "model": "gpt-4o" if i % 3 else "other",
        "dialect": "chat",
        "request": i // 2,
        "trigger": "threshold" if i % 4 == 0 else None,
        "read_tool_output": {"reads": [{"handle": "h"}]} if i % 5 == 0 else None,
        "client_session": "run" if i > 3 else None,
        # The compaction's own tokens, on some events (their sessions' totals sum them).
        "compaction_cost": {"input_tokens": 100 * i, "output_tokens": i} if i % 3 == 0 else None,
        "arm": "treated" if i % 2 else None,
        **more,
    }


def sample() -> list[dict[str, Any]]:
    return [event(i, f"s_{i % 7}:improved") for i in range(60)]


async def add_all(store: SQLiteStore, tenant: str, events: list[dict[str, Any]]) -> None:
    for one in events:
        store.queue_event(tenant, one["session"], one)
    await store.flush_events()


async def test_the_kept_summaries_are_the_events_summed(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    events = sample()
    await add_all(store, "t_a", events[:25])
    await add_all(store, "t_a", events[25:])
    await add_all(store, "t_a", events[10:20])  # written again (another process): not summed twice
    await add_all(store, "t_b", [event(99, "s_x:full")])
    kept = priced(await store.sessions("t_a", limit=5), PRICES)
    assert kept == summarize_sessions(events, PRICES, limit=5)
    three = next(row for row in kept if row["session"] == "s_3:improved")
    spent = [e for e in events if e["session"] == "s_3:improved" and e["compaction_cost"]]
    assert spent
    assert three["compaction_input_tokens"] == sum(e["compaction_cost"]["input_tokens"] for e in spent)
    assert three["compaction_output_tokens"] == sum(e["compaction_cost"]["output_tokens"] for e in spent)
    assert [row["session"] for row in priced(await store.sessions(None, limit=2), PRICES)] == [
        "s_x:full",
        "s_3:improved",
    ]
    assert await store.sessions("t_nobody") == []
    await store.close()


async def test_a_database_from_before_the_summaries_gets_them_at_start(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    events = sample()
    await add_all(store, "t_a", events)
    await store.close()
    with sqlite3.connect(tmp_path / "s.db") as db:
        db.execute("DROP TABLE session_summaries")
    reopened = SQLiteStore(tmp_path / "s.db")
    assert priced(await reopened.sessions("t_a", limit=50), PRICES) == summarize_sessions(events, PRICES)
    await reopened.close()


async def test_expiry_forgets_a_session_whose_events_are_all_gone(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    await add_all(store, "t_a", sample())
    await store.expire(keep_seconds=10.0, now=65.0)  # events before 55 go
    assert sorted(row["session"] for row in await store.sessions("t_a")) == [
        f"s_{i}:improved" for i in range(7) if max(t for t in range(60) if t % 7 == i) >= 55
    ]
    await store.close()


async def test_control_reads_run_on_their_own_thread_and_read_one_row_a_session(tmp_path: Path) -> None:
    """The data plane's store thread runs no control-plane read; the sessions list reads at
    most ``limit`` rows of summaries, never the events."""
    store = SQLiteStore(tmp_path / "s.db")
    await add_all(store, "t_a", [event(i, f"s_{i % 40}:improved") for i in range(3000)])
    data_plane: list[str] = []
    control: list[str] = []
    threads: set[str] = set()
    await store._run(lambda db: db.set_trace_callback(data_plane.append))

    def traced(statement: str) -> None:
        control.append(statement)
        threads.add(threading.current_thread().name)

    await store._control.run(lambda db: db.set_trace_callback(traced))
    rows = await store.sessions("t_a", limit=10)
    page = await store.events("t_a", limit=20)
    assert len(rows) == 10 and len(page) == 20
    assert data_plane == []
    assert [s.split()[0] for s in control] == ["SELECT", "SELECT"]
    assert "FROM session_summaries" in control[0] and "events" not in control[0]
    assert threads and all(name.startswith("store-control") for name in threads)
    read_rows = await store._control.run(
        lambda db: db.execute("SELECT count(*) FROM session_summaries WHERE tenant = 't_a'").fetchone()[0]
    )
    assert read_rows == 40  # one summary a session, however many events
    await store.close()


async def test_a_preparations_own_event_adds_its_tokens_but_no_request_or_point(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    requests = [event(i, "s_1:improved", compaction_cost=None, arm="treated") for i in (4, 5, 6)]
    preparation = {
        "event_id": "e_prep",
        "kind": "preparation",  # proxy/telemetry/compaction_cost.py: after the last request
        "session": "s_1:improved",
        "time": 7.0,
        "policy": "improved",
        "model": "gpt-4o",
        "trigger": None,
        "request": None,
        "arm": "treated",
        "compaction_cost": {"input_tokens": 700, "output_tokens": 70},
    }
    await add_all(store, "t_a", [*requests, preparation])
    (kept,) = await store.sessions("t_a")
    (alone,) = summarize_sessions(requests, PRICES)
    assert kept["events"] == alone["events"] == 3 and kept["requests"] == alone["requests"]
    for name in ("compaction_points", "tokens_saved", "reads"):
        assert kept[name] == alone[name]
    assert (kept["compaction_input_tokens"], kept["compaction_output_tokens"]) == (700, 70)
    assert kept["arm"] == "treated" and kept["model"] == "gpt-4o"
    assert priced([kept], PRICES) == summarize_sessions([*requests, preparation], PRICES)
    await store.close()
