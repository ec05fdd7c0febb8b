"""Prepared summaries shared by the processes of one store: a summary prepared by one replica
(or worker) is taken by whichever serves the session's next compaction point.

Keyed by tenant and session; ``take`` reads and removes in one step, so two replicas never use
one preparation twice. Kept as long as saved outputs (``store.keep_days``) on Redis, until the
store's expiry on SQLite.

``claim``: the first process past a session's prepare mark claims the preparation of its next
point from the narrative the session's summary has now, for the summarizer's timeout; the
others leave it to that one (each would otherwise pay the summarizer for the same range, and
the last to land would replace the first). A point that finds nothing ready prepares anyway.
"""

from __future__ import annotations

import math
import sqlite3
import time
from typing import Protocol

from proxy.state.redis_store import RedisStore, _as_bytes
from proxy.state.sqlite_store import SQLiteStore
from proxy.state.sqlite_transaction import transaction

_SCHEMA = """
CREATE TABLE IF NOT EXISTS prepared (
    key TEXT PRIMARY KEY, data BLOB NOT NULL, updated REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS prepared_claims (key TEXT PRIMARY KEY, until REAL NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS prepared_claims_until ON prepared_claims (until);
"""


class PreparedStore(Protocol):
    async def put(self, tenant: str, session: str, data: bytes) -> None: ...
    async def take(self, tenant: str, session: str) -> bytes | None: ...
    async def claim(self, tenant: str, session: str, built_on: str, seconds: float) -> bool: ...


class SQLitePrepared:
    def __init__(self, store: SQLiteStore) -> None:
        self.store = store
        self._ready = False

    async def _schema(self) -> None:
        if not self._ready:
            await self.store._run(lambda db: db.executescript(_SCHEMA))
            self._ready = True

    async def put(self, tenant: str, session: str, data: bytes) -> None:
        await self._schema()
        key = f"{tenant}\x1f{session}"
        await self.store._run(
            lambda db: db.execute(
                "INSERT INTO prepared (key, data, updated) VALUES (?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET data = excluded.data, updated = excluded.updated",
                (key, data, time.time()),
            )
        )

    async def take(self, tenant: str, session: str) -> bytes | None:
        await self._schema()
        key = f"{tenant}\x1f{session}"

        def take(db: sqlite3.Connection) -> bytes | None:
            with transaction(db):
                row = db.execute("DELETE FROM prepared WHERE key = ? RETURNING data", (key,)).fetchone()
            return bytes(row[0]) if row else None

        found: bytes | None = await self.store._run(take)
        return found

    async def claim(self, tenant: str, session: str, built_on: str, seconds: float) -> bool:
        await self._schema()
        key = f"{tenant}\x1f{session}\x1f{built_on}"

        def claim(db: sqlite3.Connection) -> bool:
            now = time.time()
            with transaction(db):
                db.execute("DELETE FROM prepared_claims WHERE until < ?", (now,))
                cursor = db.execute(
                    "INSERT INTO prepared_claims (key, until) VALUES (?, ?) ON CONFLICT (key) DO NOTHING",
                    (key, now + seconds),
                )
            return cursor.rowcount == 1

        claimed: bool = await self.store._run(claim)
        return claimed


class RedisPrepared:
    def __init__(self, store: RedisStore) -> None:
        self.store = store

    async def put(self, tenant: str, session: str, data: bytes) -> None:
        await self.store.client.set(f"cpx:prep:{tenant}:{session}", data, ex=self.store.keep)

    async def take(self, tenant: str, session: str) -> bytes | None:
        raw = await self.store.client.getdel(f"cpx:prep:{tenant}:{session}")
        return _as_bytes(raw) if raw is not None else None

    async def claim(self, tenant: str, session: str, built_on: str, seconds: float) -> bool:
        key = f"cpx:prepping:{tenant}:{session}:{built_on or '-'}"
        return bool(await self.store.client.set(key, b"1", ex=max(1, math.ceil(seconds)), nx=True))


def make_prepared_store(store: object) -> PreparedStore | None:
    if isinstance(store, RedisStore):
        return RedisPrepared(store)
    if isinstance(store, SQLiteStore):
        return SQLitePrepared(store)
    return None
