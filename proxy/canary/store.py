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

**A pause judged on an epoch lands only in that epoch** (``pause(record, epoch)``): a replica
that judged the figures of an epoch an operator has since ended with ``canary resume`` cannot
pause the new one with them; it judges the new epoch's figures at its next interval. The same
rule lets a replica put back a pause the store lost (``CanaryJudge``): the epoch it saw is
never older than the store's. What the store holds that a replica did not write is read by
``proxy.canary.book_records``' rules (an unreadable pause is a pause).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

import orjson

from proxy.canary.book_records import decoded_blob, decoded_hash, session_of, state_of
from proxy.canary.gate import ARMS, COUNTED
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


class Figures(NamedTuple):
    """The sessions read back, and how many records could not be read (left out)."""

    sessions: list[dict[str, Any]]
    unreadable: int = 0


class CanaryBook(Protocol):
    async def add(
        self, key: str, arm: str, counted: Mapping[str, float], last_answer: str | None, now: float
    ) -> None: ...
    async def arm(self, key: str) -> str | None: ...
    async def sessions(self, since: float) -> Figures: ...
    async def state(self) -> dict[str, Any]: ...
    async def pause(self, record: dict[str, Any], epoch: float) -> bool: ...
    async def resume(self, now: float) -> None: ...


def _figures(rows: list[tuple[str | bytes, dict[str, Any] | None]]) -> Figures:
    """Each readable session with its tenant (the head of its key); the rest counted."""
    found: list[dict[str, Any]] = []
    for key, raw in rows:
        session = session_of(raw) if raw is not None else None
        if session is None:
            continue
        text = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
        session["tenant"] = text.split("\x1f", 1)[0]
        found.append(session)
    return Figures(found, len(rows) - len(found))


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
                session = _merged(decoded_blob(row[0]) if row else None, arm, counted, last_answer, now)
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

    async def sessions(self, since: float) -> Figures:
        def read(db: sqlite3.Connection) -> list[tuple[str, bytes]]:
            rows = db.execute("SELECT key, data FROM canary_sessions WHERE last >= ?", (since,))
            return [(str(r[0]), bytes(r[1])) for r in rows]

        return _figures([(key, decoded_blob(raw)) for key, raw in await self._run(read)])

    async def state(self) -> dict[str, Any]:
        def read(db: sqlite3.Connection) -> bytes | None:
            row = db.execute("SELECT data FROM canary_state WHERE id = 1").fetchone()
            return bytes(row[0]) if row else None

        return _sqlite_state(await self._run(read))

    async def pause(self, record: dict[str, Any], epoch: float) -> bool:
        def write(db: sqlite3.Connection) -> bool:
            with transaction(db):
                row = db.execute("SELECT data FROM canary_state WHERE id = 1").fetchone()
                state = _sqlite_state(bytes(row[0]) if row else None)
                if state["paused"] or state["epoch"] > epoch:
                    return False
                db.execute(
                    "INSERT INTO canary_state (id, data) VALUES (1, ?) "
                    "ON CONFLICT (id) DO UPDATE SET data = excluded.data",
                    (orjson.dumps({"epoch": epoch, "paused": record}),),
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


def _sqlite_state(raw: bytes | None) -> dict[str, Any]:
    if raw is None:
        return state_of(None, None)
    stored = decoded_blob(raw)
    if stored is None:  # the whole row is unreadable: its pause too
        return state_of(None, b"", ["epoch"])
    paused = stored.get("paused")
    return state_of(stored.get("epoch"), orjson.dumps(paused) if paused is not None else None)


# The pause lands only if none stands and the epoch judged is not older than the store's (a
# missing or unreadable epoch is 0); it writes that epoch back. Keys of another type than a
# string are the pause's (a pause) or the epoch's (replaced).
_PAUSE = """
local paused_type = redis.call('TYPE', KEYS[1])['ok']
if paused_type ~= 'none' then return 0 end
local epoch_type = redis.call('TYPE', KEYS[2])['ok']
local stored = 0
if epoch_type == 'string' then stored = tonumber(redis.call('GET', KEYS[2])) or 0 end
if stored > tonumber(ARGV[2]) then return 0 end
redis.call('DEL', KEYS[2])
redis.call('SET', KEYS[2], ARGV[2])
redis.call('SET', KEYS[1], ARGV[1])
return 1
"""
_PAUSED, _EPOCH = "cpx:canary:paused", "cpx:canary:epoch"


class RedisCanaryBook:
    """On Redis: a hash per session (HINCRBYFLOAT: replicas add at once without a lock), an
    index by last request time, the epoch, and the pause (a script: the first replica wins,
    and only in the epoch it judged)."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.client = store.client
        self._pause = self.client.register_script(_PAUSE)

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
        arm = _as_bytes(raw).decode("utf-8", "replace") if raw is not None else None
        return arm if arm in ARMS else None

    async def sessions(self, since: float) -> Figures:
        keys = await self.client.zrangebyscore("cpx:canary:idx", since, "+inf")
        rows: list[tuple[str | bytes, dict[str, Any] | None]] = []
        for start in range(0, len(keys), 500):
            batch = keys[start : start + 500]
            async with self.client.pipeline(transaction=False) as pipe:
                for key in batch:
                    pipe.hgetall(b"cpx:canary:s:" + _as_bytes(key))
                # A key of another type answers an error in its place, read as unreadable.
                answers = await pipe.execute(raise_on_error=False)
            for key, raw in zip(batch, answers, strict=True):
                if isinstance(raw, dict) and raw:
                    rows.append((_as_bytes(key), decoded_hash(raw)))
                elif raw:  # an error: the key is not a hash
                    rows.append((_as_bytes(key), None))
        return _figures(rows)

    async def state(self) -> dict[str, Any]:
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.type(_EPOCH)
            pipe.type(_PAUSED)
            pipe.mget(_EPOCH, _PAUSED)
            epoch_type, paused_type, (epoch, paused) = await pipe.execute()
        damaged = []
        if _as_bytes(epoch_type) not in (b"none", b"string"):
            damaged.append("epoch")
        if _as_bytes(paused_type) not in (b"none", b"string"):
            paused = b""  # something of another type stands where the pause is kept
        return state_of(epoch, paused, damaged)

    async def pause(self, record: dict[str, Any], epoch: float) -> bool:
        landed = await self._pause(keys=[_PAUSED, _EPOCH], args=[orjson.dumps(record), repr(epoch)])
        return bool(landed)

    async def resume(self, now: float) -> None:
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(_PAUSED, _EPOCH)
            pipe.set(_EPOCH, repr(now))
            await pipe.execute()


def make_canary_book(store: Any) -> CanaryBook:
    if isinstance(store, RedisStore):
        return RedisCanaryBook(store)
    return SQLiteCanaryBook(store)
