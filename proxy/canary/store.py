"""Where the canary keeps its figures and its pause: beside the store, so replicas on one Redis
(or processes on one SQLite file) share the arm of every session seen, the figures, and the
pause.

A session's figures are sums (``proxy.canary.gate.COUNTED``) plus its arm, first and last request
times and how its last answer ended. The state is the epoch (figures count from it: a resume
starts a new one) and the pause (when, why, and the figures that tripped the gate); pausing
is first-come, so exactly one replica records the rollback.

A session's tenant (the hash ``proxy.state.sessions.tenant_of`` made of its key, never the key)
is the head of its book key (``tenant\x1fsession``): ``sessions`` adds it to every session it
reads, so figures written before the gate compared within tenants load as they are.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any, Protocol

import orjson

from proxy.canary.gate import COUNTED
from proxy.state.redis_store import RedisStore, _as_bytes
from proxy.state.sqlite_store import SQLiteStore
from proxy.state.sqlite_transaction import transaction

_SCHEMA = """
CREATE TABLE IF NOT EXISTS canary_sessions (
    key TEXT PRIMARY KEY, arm TEXT NOT NULL, last REAL NOT NULL, data BLOB NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS canary_by_last ON canary_sessions (last);
CREATE TABLE IF NOT EXISTS canary_state (id INTEGER PRIMARY KEY CHECK (id = 1), data BLOB NOT NULL);
"""


class CanaryBook(Protocol):
    async def add(
        self, key: str, arm: str, counted: Mapping[str, float], last_answer: str | None, now: float
    ) -> None: ...
    async def arm(self, key: str) -> str | None: ...
    async def sessions(self, since: float) -> list[dict[str, Any]]: ...
    async def state(self) -> dict[str, Any]: ...
    async def pause(self, record: dict[str, Any]) -> bool: ...
    async def resume(self, now: float) -> None: ...


def _with_tenant(key: str | bytes, session: dict[str, Any]) -> dict[str, Any]:
    text = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
    session["tenant"] = text.split("\x1f", 1)[0]
    return session


def _merged(
    old: dict[str, Any] | None, arm: str, counted: Mapping[str, float], last_answer: str | None, now: float
) -> dict[str, Any]:
    session = old or {"arm": arm, "first": now, **{k: 0 for k in COUNTED}}
    for key, value in counted.items():
        session[key] = session.get(key, 0) + value
    session["last"] = now
    if last_answer is not None:
        session["last_answer"] = last_answer
    return session


class SQLiteCanaryBook:
    def __init__(self, store: SQLiteStore) -> None:
        self.store = store
        self._ready = False

    async def _run(self, function: Any) -> Any:
        if not self._ready:
            await self.store._run(lambda db: db.executescript(_SCHEMA))
            self._ready = True
        return await self.store._run(function)

    async def add(
        self, key: str, arm: str, counted: Mapping[str, float], last_answer: str | None, now: float
    ) -> None:
        def write(db: sqlite3.Connection) -> None:
            with transaction(db):
                row = db.execute("SELECT data FROM canary_sessions WHERE key = ?", (key,)).fetchone()
                session = _merged(orjson.loads(row[0]) if row else None, arm, counted, last_answer, now)
                db.execute(
                    "INSERT INTO canary_sessions (key, arm, last, data) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (key) DO UPDATE SET last = excluded.last, data = excluded.data",
                    (key, session["arm"], now, orjson.dumps(session)),
                )

        await self._run(write)

    async def arm(self, key: str) -> str | None:
        def read(db: sqlite3.Connection) -> str | None:
            row = db.execute("SELECT arm FROM canary_sessions WHERE key = ?", (key,)).fetchone()
            return str(row[0]) if row else None

        result: str | None = await self._run(read)
        return result

    async def sessions(self, since: float) -> list[dict[str, Any]]:
        def read(db: sqlite3.Connection) -> list[tuple[str, bytes]]:
            rows = db.execute("SELECT key, data FROM canary_sessions WHERE last >= ?", (since,))
            return [(str(r[0]), bytes(r[1])) for r in rows]

        return [_with_tenant(key, orjson.loads(raw)) for key, raw in await self._run(read)]

    async def state(self) -> dict[str, Any]:
        def read(db: sqlite3.Connection) -> bytes | None:
            row = db.execute("SELECT data FROM canary_state WHERE id = 1").fetchone()
            return bytes(row[0]) if row else None

        raw = await self._run(read)
        return orjson.loads(raw) if raw else {"epoch": 0.0, "paused": None}

    async def pause(self, record: dict[str, Any]) -> bool:
        def write(db: sqlite3.Connection) -> bool:
            with transaction(db):
                row = db.execute("SELECT data FROM canary_state WHERE id = 1").fetchone()
                state = orjson.loads(row[0]) if row else {"epoch": 0.0, "paused": None}
                if state.get("paused"):
                    return False
                state["paused"] = record
                db.execute(
                    "INSERT INTO canary_state (id, data) VALUES (1, ?) "
                    "ON CONFLICT (id) DO UPDATE SET data = excluded.data",
                    (orjson.dumps(state),),
                )
            return True

        paused: bool = await self._run(write)
        return paused

    async def resume(self, now: float) -> None:
        data = orjson.dumps({"epoch": now, "paused": None})
        await self._run(
            lambda db: db.execute(
                "INSERT INTO canary_state (id, data) VALUES (1, ?) "
                "ON CONFLICT (id) DO UPDATE SET data = excluded.data",
                (data,),
            )
        )


class RedisCanaryBook:
    """On Redis: a hash per session (HINCRBYFLOAT: replicas add at once without a lock), an
    index by last request time, the epoch, and the pause (SET NX: the first replica wins)."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.client = store.client

    async def add(
        self, key: str, arm: str, counted: Mapping[str, float], last_answer: str | None, now: float
    ) -> None:
        name = f"cpx:canary:s:{key}"
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hsetnx(name, "arm", arm)
            pipe.hsetnx(name, "first", now)
            for field, value in counted.items():
                pipe.hincrbyfloat(name, field, value)
            pipe.hset(name, "last", now)
            if last_answer is not None:
                pipe.hset(name, "last_answer", last_answer)
            pipe.expire(name, self.store.keep)
            pipe.zadd("cpx:canary:idx", {key: now})
            await pipe.execute()

    async def arm(self, key: str) -> str | None:
        raw = await self.client.hget(f"cpx:canary:s:{key}", "arm")
        return _as_bytes(raw).decode() if raw is not None else None

    async def sessions(self, since: float) -> list[dict[str, Any]]:
        keys = await self.client.zrangebyscore("cpx:canary:idx", since, "+inf")
        found = []
        for start in range(0, len(keys), 500):
            batch = keys[start : start + 500]
            async with self.client.pipeline(transaction=False) as pipe:
                for key in batch:
                    pipe.hgetall(b"cpx:canary:s:" + _as_bytes(key))
                for key, raw in zip(batch, await pipe.execute(), strict=True):
                    if raw:
                        found.append(_with_tenant(_as_bytes(key), _decoded(raw)))
        return found

    async def state(self) -> dict[str, Any]:
        epoch, paused = await self.client.mget("cpx:canary:epoch", "cpx:canary:paused")
        return {"epoch": float(epoch or 0.0), "paused": orjson.loads(paused) if paused else None}

    async def pause(self, record: dict[str, Any]) -> bool:
        return bool(await self.client.set("cpx:canary:paused", orjson.dumps(record), nx=True))

    async def resume(self, now: float) -> None:
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.delete("cpx:canary:paused")
            pipe.set("cpx:canary:epoch", now)
            await pipe.execute()


def _decoded(raw: Mapping[bytes, bytes]) -> dict[str, Any]:
    session: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.decode()
        text = value.decode()
        session[name] = text if name in ("arm", "last_answer") else float(text)
    return session


def make_canary_book(store: Any) -> CanaryBook:
    if isinstance(store, RedisStore):
        return RedisCanaryBook(store)
    return SQLiteCanaryBook(store)
