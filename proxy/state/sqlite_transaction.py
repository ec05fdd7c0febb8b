"""One SQLite transaction around a block of statements.

The store's connections run in autocommit mode (``isolation_level=None``): the proxy decides
where each transaction begins and ends. In that mode ``with connection:`` begins nothing, so
``executemany`` of ten rows is ten transactions, each writing the database's first page, the
table's and its indexes' pages again and taking and dropping the file's locks: a batch must be
wrapped in an explicit ``BEGIN``/``COMMIT``, and a read-then-write must be too to be atomic.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` (the write lock up front: two processes that both read first and
    then write could otherwise each wait for the other), ``COMMIT`` at the end of the block,
    ``ROLLBACK`` if it raises."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        # SQLite may already have rolled back (a full disk, an interrupted statement).
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
