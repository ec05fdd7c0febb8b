"""The canary's book tampered with, lost, and raced, on a real Redis and on SQLite.

The judge and the placement run as each replica runs them (``CanaryJudge``, ``CanaryArms`` on
the store's own book); two replicas are two stores on one Redis (or one SQLite file), each
with its own connection. What the store holds is written behind their backs with a plain Redis
client or ``sqlite3``, as a bad script or a flushed server would leave it."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
import redis

from proxy.canary.runtime import CanaryArms, CanaryJudge
from proxy.canary.store import CanaryBook, make_canary_book
from proxy.config.sections import CanaryGate, CanarySettings
from proxy.state.redis_store import RedisStore
from proxy.state.sqlite_store import SQLiteStore
from proxy.telemetry.events import EventSink
from proxy.telemetry.metrics import Metrics

pytestmark = pytest.mark.e2e

SETTINGS = CanarySettings(share=0.5, gate=CanaryGate(min_sessions=5), evaluate_every_seconds=0.1)
Store = RedisStore | SQLiteStore


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))


class Events:
    def __init__(self) -> None:
        self.emitted: list[dict[str, Any]] = []

    def emit(self, event: dict[str, Any]) -> None:
        self.emitted.append(event)


class Replica:
    """One replica's canary: its store connection, book, arms, judge, metrics, events, log."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.book: CanaryBook = make_canary_book(store)
        self.metrics, self.log, self.events = Metrics(), Log(), Events()
        self.arms = CanaryArms(SETTINGS, self.book, self.metrics, self.log)
        sink = cast(EventSink, self.events)
        self.judge = CanaryJudge(SETTINGS, self.book, self.arms, self.metrics, sink, self.log)

    def incidents(self, kind: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "compaction_proxy_canary_book_incidents_total", {"kind": kind}
        )
        return value or 0.0


class Backend:
    """Two replicas' stores on one Redis or one SQLite file, and writes behind their backs."""

    def __init__(self, kind: str, place: str) -> None:
        self.kind, self.place = kind, place

    def store(self) -> Store:
        if self.kind == "redis":
            return RedisStore(self.place, keep_seconds=3600)
        return SQLiteStore(Path(self.place))

    def raw_redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.place)

    def set_state(self, data: bytes) -> None:
        """The SQLite state row, as stored."""
        with sqlite3.connect(self.place) as db:
            db.execute("INSERT OR REPLACE INTO canary_state (id, data) VALUES (1, ?)", (data,))

    def lose_everything(self) -> None:
        if self.kind == "redis":
            self.raw_redis().flushall()
        else:
            with sqlite3.connect(self.place) as db:
                db.execute("DELETE FROM canary_state")
                db.execute("DELETE FROM canary_sessions")


@pytest.fixture(params=["sqlite", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        return Backend("sqlite", str(tmp_path / "book.db"))
    url = request.getfixturevalue("redis_url")
    redis.Redis.from_url(url).flushall()  # the Redis server is shared by the session's tests
    return Backend("redis", url)


def run(backend: Backend, body: Callable[[Replica, Replica], Awaitable[None]]) -> None:
    async def main() -> None:
        first, second = Replica(backend.store()), Replica(backend.store())
        try:
            await body(first, second)
        finally:
            await first.store.close()
            await second.store.close()

    asyncio.run(main())


async def harmful_figures(book: CanaryBook, sessions: int = 8, tenant: str = "t1") -> None:
    """Treated sessions all refused for their window, the holdout fine: a breach."""
    now = time.time()
    for n in range(sessions):
        await book.add(f"{tenant}\x1ftr{n}", "treated", {"requests": 1, "context_errors": 1}, None, now)
        await book.add(f"{tenant}\x1fho{n}", "holdout", {"requests": 1}, "final", now)


def test_two_replicas_racing_the_gate_record_one_pause(backend: Backend) -> None:
    async def body(first: Replica, second: Replica) -> None:
        await harmful_figures(first.book)
        reports = await asyncio.gather(first.judge.evaluate(), second.judge.evaluate())
        assert all(r["paused"] and r["paused"]["reason"] == ["context_error_share"] for r in reports)
        rollbacks = first.events.emitted + second.events.emitted
        assert len(rollbacks) == 1 and rollbacks[0]["kind"] == "canary_rollback"
        assert first.arms.paused and second.arms.paused
        name = "compaction_proxy_canary_rollbacks_total"
        counted = [r.metrics.registry.get_sample_value(name) for r in (first, second)]
        assert sorted(counted) == [0.0, 1.0]

    run(backend, body)


def test_a_pause_judged_before_a_resume_does_not_pause_the_new_epoch(backend: Backend) -> None:
    async def body(first: Replica, second: Replica) -> None:
        await harmful_figures(first.book)
        book = first.book
        read_figures = book.sessions

        async def resumed_meanwhile(since: float) -> Any:
            figures = await read_figures(since)
            await second.book.resume(time.time())  # the operator, between the read and the pause
            return figures

        book.sessions = resumed_meanwhile  # type: ignore[method-assign]
        report = await first.judge.evaluate()
        book.sessions = read_figures  # type: ignore[method-assign]
        assert report["verdict"] == "breach" and report["paused"] is None and first.events.emitted == []
        state = await second.book.state()
        assert state["paused"] is None and state["epoch"] > 0
        # The new epoch has no figures yet: nothing to judge, nothing paused.
        assert (await first.judge.evaluate())["verdict"] == "waiting"

    run(backend, body)


def test_a_pause_the_store_lost_is_put_back_and_a_resume_is_not(backend: Backend) -> None:
    async def body(first: Replica, second: Replica) -> None:
        await harmful_figures(first.book)
        await first.judge.evaluate()
        await second.judge.evaluate()
        assert second.arms.paused
        backend.lose_everything()  # a Redis restarted without its file, a flushed database
        report = await second.judge.evaluate()
        assert report["paused"] is not None and report["paused"]["restored"] > 0
        assert report["paused"]["reason"] == ["context_error_share"] and second.arms.paused
        assert second.incidents("pause_restored") == 1
        # Every replica sees it back; the one that saw it too does not put it back twice.
        assert (await first.judge.evaluate())["paused"] is not None and first.incidents("pause_restored") == 0
        # A resume starts a newer epoch: lifted on purpose, never put back.
        await first.book.resume(time.time())
        for replica in (first, second):
            assert (await replica.judge.evaluate())["paused"] is None and not replica.arms.paused
        assert second.incidents("pause_restored") == 1

    run(backend, body)


def test_an_unreadable_pause_holds_the_policy_back_until_resumed(backend: Backend) -> None:
    async def body(first: Replica, second: Replica) -> None:
        await harmful_figures(first.book, sessions=2)  # too few to judge: only the record pauses
        if backend.kind == "redis":
            backend.raw_redis().set("cpx:canary:paused", b"\x00garbage")
        else:
            await first.book.state()  # the table exists
            backend.set_state(b"garbage")
        report = await first.judge.evaluate()
        assert report["paused"]["reason"] == ["unreadable_pause_record"] and first.arms.paused
        assert "paused" in report["damaged"] and first.incidents("damaged") == 1
        # A new treated-by-hash session goes to the holdout; one the book has treated stays.
        in_flight, fresh = [s for s in (f"s{n}" for n in range(200)) if _hashed("t1", s) == "treated"][:2]
        await first.book.add(f"t1\x1f{in_flight}", "treated", {"requests": 1}, "tool", time.time())
        assert await first.arms.arm_for("t1", in_flight) == "treated"
        assert await first.arms.arm_for("t1", fresh) == "holdout"
        await second.book.resume(time.time())
        assert (await first.judge.evaluate())["paused"] is None and not first.arms.paused

    run(backend, body)


def _hashed(tenant: str, session: str) -> str:
    from proxy.canary.gate import arm_of

    return arm_of(SETTINGS.salt, tenant, session, SETTINGS.share)


def test_redis_keys_of_other_types_and_garbage_fields_never_blind_the_gate(redis_url: str) -> None:
    backend = Backend("redis", redis_url)
    raw = backend.raw_redis()
    raw.flushall()

    async def body(first: Replica, second: Replica) -> None:
        await harmful_figures(first.book)
        now = time.time()
        # Sessions in the index that are not the book's: another type, garbage figures, not
        # UTF-8, an arm that is none.
        raw.zadd("cpx:canary:idx", {"t2\x1fa": now, "t2\x1fb": now, "t2\x1fc": now, "t2\x1fd": now})
        raw.rpush("cpx:canary:s:t2\x1fa", "x")
        raw.hset("cpx:canary:s:t2\x1fb", mapping={"arm": "treated", "requests": "lots"})
        raw.hset("cpx:canary:s:t2\x1fc", mapping={"arm": b"\xff\xfe", "requests": "1"})
        raw.hset("cpx:canary:s:t2\x1fd", mapping={"arm": "everyone", "requests": "1"})
        raw.set("cpx:canary:epoch", "yesterday")
        report = await first.judge.evaluate()
        assert report["unreadable_sessions"] == 4 and report["damaged"] == ["epoch"]
        assert report["arms"]["treated"]["sessions"] == 8 and report["verdict"] == "breach"
        assert report["paused"]["reason"] == ["context_error_share"]  # the pause landed anyway
        assert float(raw.get("cpx:canary:epoch") or 0) == 0.0  # and mended the epoch

    run(backend, body)
    raw.flushall()

    async def hash_at_the_pause(first: Replica, second: Replica) -> None:
        # A key of another type where the pause is kept reads as a pause, not as "none".
        raw.hset("cpx:canary:paused", mapping={"x": "1"})
        assert (await first.judge.evaluate())["paused"]["reason"] == ["unreadable_pause_record"]
        # Paused and the arm unreadable (a list where the session's hash is): the holdout.
        raw.rpush("cpx:canary:s:t3\x1fs", "x")
        session = next(s for s in (f"s{n}" for n in range(100)) if _hashed("t3", s) == "treated")
        raw.rename("cpx:canary:s:t3\x1fs", f"cpx:canary:s:t3\x1f{session}")
        assert await first.arms.arm_for("t3", session) == "holdout"
        assert first.incidents("arm_unread") == 1
        await second.book.resume(time.time())
        assert (await first.judge.evaluate())["paused"] is None

    run(backend, hash_at_the_pause)


def test_status_says_the_book_is_damaged(backend: Backend, tmp_path: Path) -> None:
    from proxy.commands.canary import render

    async def body(first: Replica, second: Replica) -> None:
        await harmful_figures(first.book)
        if backend.kind == "redis":
            backend.raw_redis().set("cpx:canary:paused", orjson.dumps({"reason": "no time"}))
        else:
            backend.set_state(orjson.dumps({"epoch": "x", "paused": {"reason": "no time"}}))
        text = render(await first.judge.evaluate())
        assert "PAUSED" in text and "unreadable_pause_record" in text and "DAMAGED book" in text

    run(backend, body)
