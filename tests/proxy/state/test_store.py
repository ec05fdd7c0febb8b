"""The SQLite store: outputs are content-addressed per tenant, written once, readable after a
reopen, expired into tombstones; checkpoints round-trip exactly; events filter by session."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import stat
from pathlib import Path
from typing import Any

import pytest

from policies.ledger import Ledger
from policies.pipeline import Checkpoint, Offload
from policies.tokens import TokenCounter
from proxy.read_loop.commands import LoopLimits
from proxy.read_loop.store_reads import read_saved_output
from proxy.read_tool.tool import ReadLimits
from proxy.state.sqlite_store import SQLiteStore
from proxy.state.store import decode_checkpoint, encode_checkpoint


@pytest.fixture
async def store(tmp_path: Path) -> SQLiteStore:
    return SQLiteStore(tmp_path / "state" / "c.db")


COUNTER = TokenCounter()


async def run_read(store: SQLiteStore, tenant: str, arguments: object, max_lines: int) -> tuple[str, str]:
    limits = LoopLimits(read=ReadLimits(max_lines=max_lines))
    result = await read_saved_output(
        store, tenant, arguments, limits=limits, room=100_000, counter=COUNTER, encoding="o200k_base"
    )
    return result.text, result.outcome


OUTPUT = Offload(
    handle="out_1", content="\n".join(f"line {i}" for i in range(1, 501)), description="run | 500 lines"
)


async def test_outputs_are_per_tenant_and_durable(store: SQLiteStore, tmp_path: Path) -> None:
    await store.put_outputs("t_a", [OUTPUT])
    await store.put_outputs("t_a", [OUTPUT])  # already stored: no second write
    found = await store.get_output("t_a", "out_1")
    assert found is not None and found.content == OUTPUT.content
    assert await store.get_output("t_b", "out_1") is None
    await store.close()
    reopened = SQLiteStore(tmp_path / "state" / "c.db")
    again = await reopened.get_output("t_a", "out_1")
    assert again is not None and again.content == OUTPUT.content
    mode = stat.S_IMODE(os.stat(tmp_path / "state" / "c.db").st_mode)
    assert mode == 0o600
    await reopened.close()


async def test_expiry_leaves_a_tombstone_then_forgets(store: SQLiteStore) -> None:
    await store.put_outputs("t", [OUTPUT])
    future = 1e10
    assert await store.expire(7 * 86_400) == 0  # fresh: nothing expires
    assert await store.expire(1.0, now=future) == 1
    expired = await store.get_output("t", "out_1")
    assert expired is not None and expired.expired
    text, outcome = await run_read(store, "t", {"handle": "out_1"}, 100)
    assert outcome == "expired" and "expired" in text
    await store.expire(1.0, now=future * 3)
    assert await store.get_output("t", "out_1") is None
    await store.close()


async def test_read_paging_and_pattern(store: SQLiteStore) -> None:
    await store.put_outputs("t", [OUTPUT])
    text, outcome = await run_read(store, "t", '{"handle": "out_1", "start_line": 10, "num_lines": 3}', 100)
    assert outcome == "ok"
    assert text.splitlines() == [
        "handle=out_1: lines 10-12 of 500",
        " 10| line 10",
        " 11| line 11",
        " 12| line 12",
    ]
    text, _ = await run_read(store, "t", {"handle": "handle=out_1", "pattern": "^line 250$"}, 100)
    assert "1 matching line(s) of 500" in text and "250| line 250" in text and "248| line 248" in text
    text, _ = await run_read(store, "t", {"handle": "out_1", "num_lines": 10_000}, 100)
    assert "lines 1-100 of 500" in text
    assert (await run_read(store, "t", "{not json", 100))[1] == "bad_arguments"
    assert (await run_read(store, "t", {"handle": "out_1", "pattern": "("}, 100))[1] == "bad_arguments"
    assert (await run_read(store, "other", {"handle": "out_1"}, 100))[1] == "not_found"
    await store.close()


async def test_checkpoints_round_trip_exactly(store: SQLiteStore) -> None:
    checkpoint = Checkpoint(
        summary={"role": "user", "content": "summary"},
        summary_at=2,
        covered=10,
        pinned=(5,),
        covered_digest="abc",
        placeholders={"d1": {"role": "tool", "tool_call_id": "c", "content": "[saved]"}},
        dropped=frozenset({"d2"}),
        ledger=Ledger(goal="g", handles=("out_1",)),
        handles=("out_1",),
        compactions=2,
        requests=7,
        recent_compactions=(3, 6),
    )
    assert decode_checkpoint(encode_checkpoint(checkpoint)) == checkpoint
    await store.save_checkpoint("t", "s1", checkpoint)
    assert await store.load_checkpoint("t", "s1") == checkpoint
    assert await store.load_checkpoint("other", "s1") is None
    await store.close()


async def test_events_filter_by_tenant_session_and_time(store: SQLiteStore) -> None:
    for i in range(5):
        await store.add_event("t", f"s{i % 2}", {"event_id": f"e{i}", "time": float(i), "policy": "improved"})
    await store.add_event("u", "s0", {"event_id": "x", "time": 1.0, "policy": "improved"})
    assert [e["event_id"] for e in await store.events("t", session="s0")] == ["e0", "e2", "e4"]
    assert [e["event_id"] for e in await store.events("t", since=3.0)] == ["e3", "e4"]
    assert len(await store.events(None)) == 6
    await store.close()


def count_event_batches(store: SQLiteStore) -> list[int]:
    """The number of events in each transaction the store writes, as it writes them."""
    batches: list[int] = []
    write = store._write_events

    def counted(db: Any, batch: Any) -> None:
        batches.append(len(store._event_rows))
        write(db, batch)

    store._write_events = counted  # type: ignore[method-assign]
    return batches


async def test_events_arriving_together_are_written_in_batches_and_each_caller_waits_for_its_own(
    store: SQLiteStore,
) -> None:
    """Events that arrive while a batch is being written go in the next one: every call
    returns once its event is stored, with far fewer transactions than events."""
    batches = count_event_batches(store)

    async def add(i: int) -> bool:
        await store.add_event("t", "s", {"event_id": f"e{i}", "time": float(i), "policy": "p"})
        return f"e{i}" in {e["event_id"] for e in await store.events("t", limit=1000)}

    assert all(await asyncio.gather(*(add(i) for i in range(200))))
    assert [e["event_id"] for e in await store.events("t", limit=1000)] == [f"e{i}" for i in range(200)]
    assert sum(batches) == 200 and len([b for b in batches if b]) < 50
    newest = await store.events("t", limit=3, newest=True)
    assert [e["event_id"] for e in newest] == ["e199", "e198", "e197"]
    await store.close()


async def test_events_linger_into_one_batch_and_are_read_back_at_once(tmp_path: Path) -> None:
    """Events that arrive one by one within the linger share one transaction; a read in the
    same process writes the waiting batch first, and closing the store writes it too."""
    store = SQLiteStore(tmp_path / "c.db", event_linger=5.0)
    batches = count_event_batches(store)
    adds = []
    for i in range(20):
        adds.append(asyncio.ensure_future(store.add_event("t", "s", {"event_id": f"e{i}", "time": float(i)})))
        await asyncio.sleep(0.002)  # one at a time, as requests finish
    started = asyncio.get_running_loop().time()
    assert len(await store.events("t", limit=100)) == 20  # without waiting out the 5 s linger
    assert asyncio.get_running_loop().time() - started < 2.0
    await asyncio.gather(*adds)
    assert batches == [20]
    late = asyncio.ensure_future(store.add_event("t", "s", {"event_id": "late", "time": 99.0}))
    await asyncio.sleep(0.01)
    await store.close()  # does not wait out the linger either, and loses nothing
    await late
    reopened = SQLiteStore(tmp_path / "c.db")
    assert [e["event_id"] for e in await reopened.events("t", limit=100)][-1] == "late"
    await reopened.close()


async def test_a_database_another_process_locks_fails_within_about_a_second(tmp_path: Path) -> None:
    """A write blocked by another process's lock gives up after the busy timeout (1 s by
    default), so the compaction service fails open instead of holding the request."""
    import sqlite3
    import time

    store = SQLiteStore(tmp_path / "state" / "c.db")
    await store.put_outputs("t_a", [OUTPUT])
    holder = sqlite3.connect(tmp_path / "state" / "c.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        started = time.perf_counter()
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            await store.put_outputs("t_a", [Offload("out_2", "other", "x")])
        assert time.perf_counter() - started < 3.0
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    await store.put_outputs("t_a", [Offload("out_2", "other", "x")])  # works again once released
    assert (await store.get_output("t_a", "out_2")) is not None
    await store.close()


async def test_outputs_are_appended_by_rowid_and_the_earlier_layout_still_works(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "new.db")
    await store.put_outputs("t", [OUTPUT])
    await store.close()
    with sqlite3.connect(tmp_path / "new.db") as db:
        (sql,) = db.execute("SELECT sql FROM sqlite_master WHERE name = 'outputs'").fetchone()
    assert "WITHOUT ROWID" not in sql and "UNIQUE (tenant, handle)" in sql
    # A store made before keeps its WITHOUT ROWID table; every statement works on it too.
    with sqlite3.connect(tmp_path / "old.db") as db:
        db.execute(
            "CREATE TABLE outputs (tenant TEXT NOT NULL, handle TEXT NOT NULL, content TEXT, "
            "description TEXT NOT NULL, created REAL NOT NULL, last_used REAL NOT NULL, "
            "PRIMARY KEY (tenant, handle)) WITHOUT ROWID"
        )
    old = SQLiteStore(tmp_path / "old.db")
    await old.put_outputs("t", [OUTPUT])
    found = await old.get_output("t", "out_1")
    assert found is not None and found.content == OUTPUT.content
    assert await old.expire(0.0, now=10**10) == 1
    expired = await old.get_output("t", "out_1")
    assert expired is not None and expired.expired
    await old.close()


async def test_a_batch_of_outputs_or_events_is_one_sqlite_transaction(store: SQLiteStore) -> None:
    """In autocommit mode ``with connection:`` begins nothing: without an explicit BEGIN each
    row was its own transaction, rewriting the first page and every index page per row. The
    events' session summary is read and written once, in the events' transaction."""
    statements: list[str] = []
    await store._run(lambda db: db.set_trace_callback(statements.append))
    await store.put_outputs("t", [Offload(f"out_{i}", f"text {i}", "d") for i in range(5)])
    await asyncio.gather(
        *(store.add_event("t", "s", {"event_id": f"e{i}", "time": float(i)}) for i in range(5))
    )
    await store._run(lambda db: db.set_trace_callback(None))
    kinds = [s.split()[0] for s in statements]
    events = ["BEGIN", *["INSERT"] * 5, "SELECT", "INSERT", "COMMIT"]
    assert kinds == ["BEGIN", *["INSERT"] * 5, "COMMIT", *events]
    assert len(await store.events("t", limit=10)) == 5
    assert (await store.get_output("t", "out_4")) is not None
    await store.close()


async def test_the_first_secret_kept_is_every_processs(tmp_path: Path) -> None:
    """Two stores on one file (two worker processes): whichever keeps a secret first, both
    read that one, after a reopen too."""
    first, second = SQLiteStore(tmp_path / "s.db"), SQLiteStore(tmp_path / "s.db")
    assert await first.secret("compaction_items", b"one") == b"one"
    assert await second.secret("compaction_items", b"two") == b"one"
    assert await second.secret("other", b"two") == b"two"
    await first.close()
    await second.close()
    reopened = SQLiteStore(tmp_path / "s.db")
    assert await reopened.secret("compaction_items", b"three") == b"one"
    await reopened.close()


async def test_a_sessions_last_send_is_swapped_and_kept_per_tenant(tmp_path: Path) -> None:
    """Two stores on one file (two worker processes) share each session's last send; an
    earlier time never replaces a later one; expiry forgets it."""
    first, second = SQLiteStore(tmp_path / "s.db"), SQLiteStore(tmp_path / "s.db")
    assert await first.swap_sent_at("t_a", "s", 100.0) is None
    assert await second.swap_sent_at("t_a", "s", 400.0) == 100.0
    assert await first.swap_sent_at("t_a", "s", 300.0) == 400.0
    assert await first.swap_sent_at("t_a", "s", 500.0) == 400.0
    assert await second.swap_sent_at("t_b", "s", 600.0) is None
    await first.expire(keep_seconds=10.0, now=10_000.0)
    assert await first.swap_sent_at("t_b", "s", 10_001.0) is None
    await first.close()
    await second.close()
