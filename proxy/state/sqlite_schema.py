"""The SQLite store's tables, and the one statement pair that needs its own transaction
outside ``sqlite_store.py``: a session's last send, swapped."""

from __future__ import annotations

import sqlite3

from proxy.state.sqlite_transaction import transaction

# Outputs are a rowid table with a unique (tenant, handle) index: a handle is a content hash,
# so keyed by it each output's kilobytes would be inserted at a random place in the table's
# tree and move with every page split; by rowid they are appended, and only the small index
# entry lands at a random place (a store made with the earlier WITHOUT ROWID layout keeps it:
# both answer the same statements).
SCHEMA = """
CREATE TABLE IF NOT EXISTS outputs (
    tenant TEXT NOT NULL, handle TEXT NOT NULL, content TEXT, description TEXT NOT NULL,
    created REAL NOT NULL, last_used REAL NOT NULL, UNIQUE (tenant, handle)
);
CREATE TABLE IF NOT EXISTS checkpoints (
    session TEXT PRIMARY KEY, tenant TEXT NOT NULL, data BLOB NOT NULL, updated REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, session TEXT NOT NULL, policy TEXT NOT NULL,
    time REAL NOT NULL, data BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS branches (
    root TEXT PRIMARY KEY, tenant TEXT NOT NULL, data BLOB NOT NULL, updated REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS checkpoint_states (
    tenant TEXT NOT NULL, digest TEXT NOT NULL, time REAL NOT NULL, data BLOB NOT NULL, UNIQUE(tenant, digest)
);
CREATE TABLE IF NOT EXISTS secrets (name TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sent_at (
    session TEXT PRIMARY KEY, tenant TEXT NOT NULL, at REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS checkpoint_states_by_time ON checkpoint_states (time);
CREATE INDEX IF NOT EXISTS events_by_tenant_time ON events (tenant, time);
CREATE INDEX IF NOT EXISTS outputs_by_use ON outputs (last_used);
"""


def swap_sent_at(db: sqlite3.Connection, tenant: str, session: str, at: float) -> float | None:
    """When ``session``'s prefix last went upstream (by any process on this file), and now
    ``at``: the prompt clock of sessions served by several processes. Another tenant's session
    of the same name is not this one."""
    with transaction(db):
        row = db.execute("SELECT tenant, at FROM sent_at WHERE session = ?", (session,)).fetchone()
        db.execute(
            "INSERT INTO sent_at (session, tenant, at) VALUES (?, ?, ?) "
            "ON CONFLICT(session) DO UPDATE SET tenant = excluded.tenant, at = MAX(at, excluded.at)",
            (session, tenant, at),
        )
    return float(row[1]) if row is not None and row[0] == tenant else None
