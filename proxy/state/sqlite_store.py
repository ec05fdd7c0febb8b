"""The embedded default store: SQLite in WAL mode under the state directory.

All SQLite work runs on one dedicated thread, so store I/O never blocks the event loop;
callers await it. An offloaded output is written (and committed) before any view that names
its handle is sent, and content already stored is not written again. Events are written in
batches (``queue_event``), one transaction a batch; each session's checkpoint template once.

Expiry keeps data ``keep_days`` after its last use, then leaves a tombstone for as long again,
so that reading an expired handle says "expired" rather than "unknown". It runs in the
background, never on the request path.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from policies.pipeline import Checkpoint, Offload
from proxy.state.checkpoint_states import (
    STATE_REFRESH_SECONDS,
    CheckpointState,
    TemplateWrites,
    by_reference,
    expand,
    references,
)
from proxy.state.session_index import PrefixDigests, Resolution, decode_branches, encode_branches, resolve
from proxy.state.session_rollup import rollup
from proxy.state.sqlite_control import ControlReader, ensure_summaries, write_summaries
from proxy.state.sqlite_schema import SCHEMA, swap_sent_at
from proxy.state.sqlite_transaction import transaction
from proxy.state.store import StoredOutput, decode_checkpoint, encode_checkpoint

T = TypeVar("T")


class _EventBatch:
    """Events written in one transaction; ``taken`` once the store's thread has its rows;
    ``now`` set to write it without waiting out the rest of its linger."""

    __slots__ = ("now", "taken", "written")
    written: asyncio.Future[None]  # set by the store right after it makes the batch

    def __init__(self) -> None:
        self.taken = False
        self.now = asyncio.Event()


class SQLiteStore:
    """``Store`` on SQLite (WAL). One connection, owned by one worker thread."""

    def __init__(self, path: str | Path, busy_timeout: float = 1.0, event_linger: float = 0.0) -> None:
        self.path = Path(path)
        # How long a statement waits for another process's lock: short, so that a request
        # whose store write is blocked goes on uncompacted (fail open) within about a second
        # instead of holding the agent's step for SQLite's default wait.
        self.busy_timeout = busy_timeout
        # Seconds a batch of events waits for more before it is written: a transaction costs
        # SQLite's locks and WAL frames, and a batch of events fills pages a lone event leaves
        # mostly empty. Readers in this process never wait for it: ``events`` writes it first.
        self.event_linger = event_linger
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")
        # The events API and the sessions list read on their own thread and connection: the
        # data plane never waits behind them (``sqlite_control.py``).
        self._control = ControlReader(self.path, busy_timeout)
        self._opened = False
        self._local = threading.local()
        # Handles known to be stored, per tenant: content already stored is not written again.
        self._known: OrderedDict[tuple[str, str], None] = OrderedDict()
        # Each event's row, its checkpoint template's row when that is to be written too, and
        # its session's rollup (summed into ``session_summaries`` in the same transaction).
        self._event_rows: list[tuple[tuple[Any, ...], tuple[Any, ...] | None, dict[str, Any]]] = []
        self._event_batch: _EventBatch | None = None
        self._templates = TemplateWrites()

    def _connection(self) -> sqlite3.Connection:
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            # Created owner-only before SQLite opens it: its -wal and -shm files are created
            # with the database file's permissions, so they are owner-only from the start too.
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
            connection = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")
            connection.executescript(SCHEMA)
            ensure_summaries(connection)
            self.path.chmod(0o600)
            self._local.connection = connection
        return connection

    async def _run(self, function: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: function(self._connection()))

    async def put_outputs(self, tenant: str, outputs: Sequence[Offload]) -> None:
        fresh = [o for o in outputs if (tenant, o.handle) not in self._known]
        if not fresh:
            return
        now = time.time()

        def write(db: sqlite3.Connection) -> None:
            with transaction(db):
                db.executemany(
                    "INSERT INTO outputs (tenant, handle, content, description, created, last_used) "
                    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, handle) DO UPDATE SET "
                    "content = excluded.content, last_used = excluded.last_used "
                    "WHERE outputs.content IS NULL",
                    [(tenant, o.handle, o.content, o.description, now, now) for o in fresh],
                )

        await self._run(write)
        for output in fresh:
            self._known[(tenant, output.handle)] = None
        while len(self._known) > 200_000:
            self._known.popitem(last=False)

    async def get_output(self, tenant: str, handle: str) -> StoredOutput | None:
        def read(db: sqlite3.Connection) -> StoredOutput | None:
            row = db.execute(
                "SELECT content, description FROM outputs WHERE tenant = ? AND handle = ?", (tenant, handle)
            ).fetchone()
            if row is None:
                return None
            if row[0] is not None:
                # A full disk or a locked file costs the output its "last used" time only: the
                # read itself succeeds.
                with contextlib.suppress(sqlite3.Error):
                    db.execute(
                        "UPDATE outputs SET last_used = ? WHERE tenant = ? AND handle = ?",
                        (time.time(), tenant, handle),
                    )
            return StoredOutput(handle=handle, content=row[0], description=row[1])

        return await self._run(read)

    async def secret(self, name: str, made: bytes) -> bytes:
        def keep(db: sqlite3.Connection) -> bytes:
            with transaction(db):
                db.execute("INSERT OR IGNORE INTO secrets (name, value) VALUES (?, ?)", (name, made))
                row = db.execute("SELECT value FROM secrets WHERE name = ?", (name,)).fetchone()
            return bytes(row[0])

        return await self._run(keep)

    async def swap_sent_at(self, tenant: str, session: str, at: float) -> float | None:
        return await self._run(lambda db: swap_sent_at(db, tenant, session, at))

    async def load_checkpoint(self, tenant: str, session: str) -> Checkpoint | None:
        def read(db: sqlite3.Connection) -> bytes | None:
            row = db.execute(
                "SELECT data FROM checkpoints WHERE session = ? AND tenant = ?", (session, tenant)
            ).fetchone()
            return None if row is None else bytes(row[0])

        data = await self._run(read)
        if data is None:
            return None
        try:
            return decode_checkpoint(data)
        except msgspec.DecodeError:
            return None  # written by an incompatible version: compact afresh

    async def save_checkpoint(self, tenant: str, session: str, checkpoint: Checkpoint) -> None:
        data = encode_checkpoint(checkpoint)

        def write(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO checkpoints (session, tenant, data, updated) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (session) DO UPDATE SET data = excluded.data, updated = excluded.updated",
                (session, tenant, data, time.time()),
            )

        await self._run(write)

    async def resolve_branch(
        self, tenant: str, root_key: str, root_session: str, digests: Sequence[str]
    ) -> Resolution:
        """The session of a request (``proxy.state.session_index``), shared by every process on this
        file: read, resolve and write back in one immediate transaction."""
        key = f"{tenant}\x1f{root_key}"

        def update(db: sqlite3.Connection) -> Resolution:
            with transaction(db):
                row = db.execute("SELECT data FROM branches WHERE root = ?", (key,)).fetchone()
                branches = decode_branches(bytes(row[0]) if row else None)
                resolution = resolve(branches, root_session, PrefixDigests(digests))
                db.execute(
                    "INSERT INTO branches (root, tenant, data, updated) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (root) DO UPDATE SET data = excluded.data, updated = excluded.updated",
                    (key, tenant, encode_branches(branches), time.time()),
                )
            return resolution

        return await self._run(update)

    async def add_event(
        self, tenant: str, session: str, event: dict[str, Any], checkpoint: CheckpointState | None = None
    ) -> None:
        await asyncio.shield(self.queue_event(tenant, session, event, checkpoint))  # once written

    def queue_event(
        self, tenant: str, session: str, event: dict[str, Any], checkpoint: CheckpointState | None = None
    ) -> asyncio.Future[None]:
        """Events are written in batches: one transaction (one hop to the store's thread) for the
        events within ``event_linger`` of the batch's first or while the previous one was written.
        The batch's future is returned. Given its ``checkpoint``, the event refers to the template."""
        template = None
        if checkpoint is None:
            data = msgspec.json.encode(event)
        else:
            data = msgspec.json.encode(by_reference(event, checkpoint))
            template = self._templates.row(tenant, checkpoint, time.time())
        row = (event["event_id"], tenant, session, event.get("policy", ""), event["time"], data)
        # One append: the template and the rollup go with their event.
        self._event_rows.append((row, template, rollup(session, event)))
        batch = self._event_batch
        if batch is None or batch.taken:
            batch = self._event_batch = _EventBatch()
            batch.written = asyncio.ensure_future(self._write_batch(batch))
        return batch.written

    async def _write_batch(self, batch: _EventBatch) -> None:
        if self.event_linger > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(batch.now.wait(), self.event_linger)
        try:
            await self._run(lambda db: self._write_events(db, batch))
        except BaseException:
            self._templates.forget()
            raise

    async def flush_events(self) -> None:
        """Write the pending batch of events now; returns once it is in the database."""
        batch = self._event_batch
        if batch is not None and not batch.written.done():
            batch.now.set()
            with contextlib.suppress(Exception):  # its writers see and count a failure
                await asyncio.shield(batch.written)

    def _write_events(self, db: sqlite3.Connection, batch: _EventBatch) -> None:
        # On the store's thread: the batch is closed before its rows are taken, so a row added
        # after the swap finds it taken and starts the next batch.
        batch.taken = True
        taken, self._event_rows = self._event_rows, []
        states = [template for _, template, _ in taken if template is not None]
        if taken:
            with transaction(db):
                db.executemany(
                    "INSERT INTO checkpoint_states (tenant, digest, time, data) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (tenant, digest) DO UPDATE SET time = excluded.time",
                    states,
                )
                # Row by row: an event already written (by another process) is not summed twice.
                written = [
                    ((row[1], row[2]), summary)
                    for row, _, summary in taken
                    if db.execute(
                        "INSERT OR IGNORE INTO events (id, tenant, session, policy, time, data) "
                        "VALUES (?, ?, ?, ?, ?, ?)",
                        row,
                    ).rowcount
                ]
                write_summaries(db, written)

    async def events(
        self,
        tenant: str | None,
        *,
        session: str | None = None,
        policy: str | None = None,
        since: float = 0.0,
        limit: int = 100,
        newest: bool = False,
    ) -> list[dict[str, Any]]:
        clauses: list[str] = ["time >= ?"]
        values: list[Any] = [since]
        for column, value in (("tenant", tenant), ("policy", policy)):
            if value is not None:
                clauses.append(f"{column} = ?")
                values.append(value)
        if session is not None:
            # A session's events are stored per policy as "<session>:<policy>".
            clauses.append("(session = ? OR substr(session, 1, ?) = ?)")
            values += [session, len(session) + 1, session + ":"]
        await self._before_control_read()
        order = "time DESC, id DESC" if newest else "time, id"
        query = f"SELECT data FROM events WHERE {' AND '.join(clauses)} ORDER BY {order} LIMIT ?"  # noqa: S608

        def read(db: sqlite3.Connection) -> list[dict[str, Any]]:
            found = [msgspec.json.decode(bytes(row[0])) for row in db.execute(query, (*values, limit))]
            templates: dict[tuple[str, str], bytes] = {}
            for key in references(found):
                row = db.execute(
                    "SELECT data FROM checkpoint_states WHERE tenant = ? AND digest = ?", key
                ).fetchone()
                if row is not None:
                    templates[key] = bytes(row[0])
            expand(found, templates)
            return found

        return await self._control.run(read)

    async def sessions(self, tenant: str | None, *, limit: int = 50) -> list[dict[str, Any]]:
        """The summaries (``proxy.state.session_rollup``) of the ``limit`` sessions with the
        newest events, newest first: kept as the events were written, ``limit`` rows read."""
        await self._before_control_read()
        return await self._control.sessions(tenant, limit)

    async def _before_control_read(self) -> None:
        """This process's own events are read back at once (the pending batch is written
        first), and the reader finds the file and its schema made by the store's thread."""
        await self.flush_events()
        if not self._opened:
            await self._run(lambda db: None)
            self._opened = True

    async def expire(self, keep_seconds: float, now: float | None = None) -> int:
        now = time.time() if now is None else now

        def sweep(db: sqlite3.Connection) -> int:
            with transaction(db):
                # A tombstone's last_used is when it expired; it is forgotten one period later.
                cleared = db.execute(
                    "UPDATE outputs SET content = NULL, last_used = ? "
                    "WHERE content IS NOT NULL AND last_used < ?",
                    (now, now - keep_seconds),
                ).rowcount
                db.execute(
                    "DELETE FROM outputs WHERE content IS NULL AND last_used < ?", (now - keep_seconds,)
                )
                db.execute("DELETE FROM checkpoints WHERE updated < ?", (now - keep_seconds,))
                db.execute("DELETE FROM branches WHERE updated < ?", (now - keep_seconds,))
                db.execute("DELETE FROM sent_at WHERE at < ?", (now - keep_seconds,))
                db.execute("DELETE FROM events WHERE time < ?", (now - keep_seconds,))
                # A session is listed while it has an event kept (its figures keep the expired).
                db.execute("DELETE FROM session_summaries WHERE last < ?", (now - keep_seconds,))
                db.execute(
                    "DELETE FROM checkpoint_states WHERE time < ?",
                    (now - keep_seconds - STATE_REFRESH_SECONDS,),
                )
            return cleared

        cleared = await self._run(sweep)
        if cleared:
            self._known.clear()
        return cleared

    async def close(self) -> None:
        await self.flush_events()
        await self._control.close()

        def shutdown(db: sqlite3.Connection) -> None:
            db.close()
            self._local.connection = None

        await self._run(shutdown)
        self._executor.shutdown(wait=True)
