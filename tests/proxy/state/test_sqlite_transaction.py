"""One explicit transaction around a block, on a connection in autocommit mode."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from proxy.state.sqlite_transaction import transaction


def _rows(db: sqlite3.Connection) -> int:
    return int(db.execute("SELECT count(*) FROM t").fetchone()[0])


def test_a_block_commits_once_and_an_error_rolls_all_of_it_back(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    db.execute("CREATE TABLE t (x)")
    with pytest.raises(ValueError), transaction(db):
        db.executemany("INSERT INTO t VALUES (?)", [(1,), (2,)])
        raise ValueError("in the middle")
    assert _rows(db) == 0 and not db.in_transaction
    with transaction(db):
        db.executemany("INSERT INTO t VALUES (?)", [(1,), (2,)])
        assert db.in_transaction
    assert _rows(db) == 2 and not db.in_transaction
    db.close()


def test_the_write_lock_is_taken_up_front(tmp_path: Path) -> None:
    """BEGIN IMMEDIATE: a second writer waits (here: fails at once) at BEGIN, before it has read
    anything a read-modify-write would base its write on."""
    first = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    first.execute("CREATE TABLE t (x)")
    second = sqlite3.connect(tmp_path / "x.db", isolation_level=None, timeout=0)
    with transaction(first):
        with pytest.raises(sqlite3.OperationalError, match="locked"), transaction(second):
            pass
        first.execute("INSERT INTO t VALUES (1)")
    assert _rows(second) == 1
    first.close()
    second.close()
