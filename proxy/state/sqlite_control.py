"""The control plane's side of the SQLite store: the events API and the sessions list read on
their own connection and thread, never on the store's thread the data plane waits on.

WAL lets a reader run beside the writer, so a tenant polling the sessions list from twenty
clients costs the data plane nothing but the event loop's share of the answer. The work is
bounded too: the sessions list reads one summary row a session (``session_summaries``, kept
in the events' own transaction by ``write_summaries``), an events page at most ``limit`` rows,
and at most ``MAX_WAITING`` control calls wait for the reader; one more is refused
(``ControlPlaneBusy``: the route answers 503 with ``Retry-After``) rather than queued without
end.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from proxy.state.session_rollup import merge, merge_all, rollup

T = TypeVar("T")

# Control calls waiting for (or on) the reader's one thread before one more is refused: they
# wait in turn (the thread is the concurrency bound), and a waiting call holds no rows, but
# the queue is not let grow without end.
MAX_WAITING = 1024
# Events folded per statement when an existing database gets its summaries.
_BACKFILL_PAGE = 2000

SUMMARY_SCHEMA = """
CREATE TABLE IF NOT EXISTS session_summaries (
    tenant TEXT NOT NULL, session TEXT NOT NULL, last REAL NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (tenant, session)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS session_summaries_by_tenant_last ON session_summaries (tenant, last);
CREATE INDEX IF NOT EXISTS session_summaries_by_last ON session_summaries (last);
"""


class ControlPlaneBusy(RuntimeError):
    """Too many control-plane reads wait already: try again in a moment."""


def write_summaries(db: sqlite3.Connection, rollups: list[tuple[tuple[str, str], dict[str, Any]]]) -> None:
    """Merge a batch's rollups (by tenant and session) into the summaries, inside the batch's
    transaction: one primary-key read and one write per session the batch touched."""
    for (tenant, session), batch in merge_all(rollups).items():
        row = db.execute(
            "SELECT data FROM session_summaries WHERE tenant = ? AND session = ?", (tenant, session)
        ).fetchone()
        kept = merge(msgspec.json.decode(bytes(row[0])) if row else None, batch)
        db.execute(
            "INSERT INTO session_summaries (tenant, session, last, data) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (tenant, session) DO UPDATE SET last = excluded.last, data = excluded.data",
            (tenant, session, kept["last"], msgspec.json.encode(kept)),
        )


def ensure_summaries(db: sqlite3.Connection) -> None:
    """Create the summaries table; a database written before it existed gets its sessions
    summed once from the events it holds (at start, on the store's thread, in pages)."""
    existed = db.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'session_summaries'"
    ).fetchone()
    db.executescript(SUMMARY_SCHEMA)
    if existed:
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        after = ""
        while True:
            page = db.execute(
                "SELECT id, tenant, session, data FROM events WHERE id > ? ORDER BY id LIMIT ?",
                (after, _BACKFILL_PAGE),
            ).fetchall()
            if not page:
                break
            after = page[-1][0]
            write_summaries(db, [((t, s), rollup(s, msgspec.json.decode(bytes(d)))) for _, t, s, d in page])
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


class ControlReader:
    """Reads for the control plane on their own thread and read-only connection."""

    def __init__(self, path: Path, busy_timeout: float) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-control")
        self._local = threading.local()
        self._waiting = 0

    def _connection(self) -> sqlite3.Connection:
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            # The store's own connection made the file and its schema before the first read.
            connection = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None)
            connection.execute("PRAGMA query_only = ON")
            self._local.connection = connection
        return connection

    async def run(self, function: Callable[[sqlite3.Connection], T]) -> T:
        if self._waiting >= MAX_WAITING:
            raise ControlPlaneBusy("Too many control-plane reads are waiting.")
        self._waiting += 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._executor, lambda: function(self._connection()))
        finally:
            self._waiting -= 1

    async def sessions(self, tenant: str | None, limit: int) -> list[dict[str, Any]]:
        """The ``limit`` sessions with the newest events, newest first: ``limit`` rows read."""
        where, values = ("WHERE tenant = ?", [tenant]) if tenant is not None else ("", [])
        query = f"SELECT data FROM session_summaries {where} ORDER BY last DESC LIMIT ?"  # noqa: S608

        def read(db: sqlite3.Connection) -> list[dict[str, Any]]:
            return [msgspec.json.decode(bytes(row[0])) for row in db.execute(query, (*values, limit))]

        return await self.run(read)

    async def close(self) -> None:
        def shutdown() -> None:
            connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
            if connection is not None:
                connection.close()
                self._local.connection = None

        await asyncio.get_running_loop().run_in_executor(self._executor, shutdown)
        self._executor.shutdown(wait=True)
