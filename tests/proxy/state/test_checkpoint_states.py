"""Checkpoint templates shared by a session's events: written once, read back exact."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import msgspec

from policies.pipeline import Checkpoint
from proxy.state.checkpoint_states import STATE_REFRESH_SECONDS, TemplateWrites, by_reference, expand
from proxy.state.sqlite_store import SQLiteStore
from proxy.state.store import encode_checkpoint
from proxy.telemetry.events import CheckpointJson

CHECKPOINT = Checkpoint(placeholders={"3:ab": {"role": "tool", "content": "saved output " * 300}})


def event_of(number: int, json: CheckpointJson, at: float) -> tuple[dict[str, object], object]:
    state = json.state("s", CHECKPOINT.with_requests(number))
    assert state is not None
    event = {
        "event_id": f"ev_{number:04d}",
        "time": at + number,
        "tenant": "t",
        "policy": "improved",
        "request": number,
        "checkpoint": msgspec.Raw(state.json()),
    }
    return event, state


def test_a_template_is_named_by_its_content_and_shared_while_only_the_count_changes() -> None:
    json = CheckpointJson()
    states = [json.state("s", CHECKPOINT.with_requests(n)) for n in (1, 2, 3)]
    assert len({s.digest for s in states if s}) == 1
    assert [s.json() for s in states if s] == [
        encode_checkpoint(CHECKPOINT.with_requests(n)) for n in (1, 2, 3)
    ]
    other = json.state("s", Checkpoint(covered=2, requests=4))
    assert other is not None and other.digest != states[0].digest  # type: ignore[union-attr]


def test_a_template_is_written_once_then_again_when_its_write_is_an_hour_old() -> None:
    json = CheckpointJson()
    state = json.state("s", CHECKPOINT.with_requests(1))
    assert state is not None
    writes = TemplateWrites()
    assert writes.row("t", state, 100.0) is not None
    assert writes.row("t", state, 101.0) is None
    assert writes.row("u", state, 101.0) is not None  # per tenant
    assert writes.row("t", state, 100.0 + STATE_REFRESH_SECONDS) is not None
    writes.forget()  # a failed batch: written again
    assert writes.row("t", state, 100.0 + STATE_REFRESH_SECONDS + 1) is not None


def test_an_event_whose_template_is_gone_says_so() -> None:
    json = CheckpointJson()
    state = json.state("s", CHECKPOINT.with_requests(2))
    assert state is not None
    stored = [
        msgspec.json.decode(msgspec.json.encode(by_reference({"tenant": "t", "checkpoint": None}, state)))
    ]
    expand(stored, {})
    assert stored == [{"tenant": "t", "checkpoint": None, "checkpoint_missing": True}]


async def test_events_between_points_store_their_checkpoint_once_and_read_it_back_whole(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "c.db")
    json = CheckpointJson()
    now = time.time()
    for number in range(1, 6):
        event, state = event_of(number, json, now)
        await store.add_event("t", "s", event, state)  # type: ignore[arg-type]
    with sqlite3.connect(tmp_path / "c.db") as db:
        assert db.execute("SELECT count(*) FROM checkpoint_states").fetchone() == (1,)
        stored = [bytes(row[0]) for row in db.execute("SELECT data FROM events")]
    assert all(b"saved output" not in data and len(data) < 400 for data in stored)
    found = await store.events("t")
    assert [msgspec.convert(e["checkpoint"], Checkpoint) for e in found] == [
        CHECKPOINT.with_requests(n) for n in range(1, 6)
    ]
    assert all("checkpoint_state" not in e and "checkpoint_missing" not in e for e in found)
    # An event stored whole (no state given, or an earlier version) reads back as it was.
    whole, _ = event_of(9, json, now)
    await store.add_event("t", "s", whole)
    assert msgspec.convert((await store.events("t", newest=True, limit=1))[0]["checkpoint"], Checkpoint) == (
        CHECKPOINT.with_requests(9)
    )
    await store.close()


async def test_expiry_keeps_a_template_as_long_as_an_event_may_refer_to_it(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "c.db")
    json = CheckpointJson()
    now = time.time()
    event, state = event_of(1, json, now)
    await store.add_event("t", "s", event, state)  # type: ignore[arg-type]
    keep = 100.0
    await store.expire(keep, now=now + keep - 10)  # the event is kept: so is its template
    (kept,) = await store.events("t")
    assert msgspec.convert(kept["checkpoint"], Checkpoint) == CHECKPOINT.with_requests(1)
    await store.expire(keep, now=now + keep + STATE_REFRESH_SECONDS + 10)
    assert await store.events("t") == []
    with sqlite3.connect(tmp_path / "c.db") as db:
        assert db.execute("SELECT count(*) FROM checkpoint_states").fetchone() == (0,)
        # Expiry finds old templates by an index, never reading each template to its time.
        plan = db.execute("EXPLAIN QUERY PLAN DELETE FROM checkpoint_states WHERE time < 1").fetchall()
        assert any("checkpoint_states_by_time" in str(row) for row in plan)
    await store.close()
