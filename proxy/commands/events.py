"""``compaction-proxy events``: compaction events read from the store, newest first.

On a terminal they are a table (``events_table.py``); piped or redirected, or with ``--json``,
JSON lines, one whole event each, so that ``| head``, ``| jq`` and ``| wc -l`` see events;
``--table`` forces the table. ``--limit`` keeps the newest. With ``--follow`` the order is
oldest first instead (the newest ``--limit``, then each new event below the last, as ``tail -f``
does), in either form.

``--session`` takes what the API takes: the client's ``X-Session-Id`` or the proxy's ``s_...``
id. A client's id is hashed with its tenant (two keys may use the same id), so without
``--tenant`` every tenant's events are scanned for the one whose hash matches. When nothing
matches, a line on stderr says why (an empty store, the filters, or events kept only when a
policy acted), and the exit code is 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import sys
import time
from collections import deque
from typing import Any

from proxy.commands.events_table import EventPrinter
from proxy.config.settings import Settings
from proxy.state.sessions import explicit_session
from proxy.state.store import Store

PAGE = 1000


def parse_since(value: str | None) -> float:
    """Unix seconds, an ISO time, or a duration back from now such as 90s, 15m, 2h, 1d."""
    if not value:
        return 0.0
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if value[-1] in units and value[:-1].replace(".", "", 1).isdigit():
        return time.time() - float(value[:-1]) * units[value[-1]]
    try:
        return float(value)
    except ValueError:
        return datetime.datetime.fromisoformat(value).timestamp()


class SessionFilter:
    """Matches events of one session named either way."""

    def __init__(self, session: str | None, tenant: str | None) -> None:
        self.given = session
        self.internal = session if session is None or session.startswith("s_") else None
        if session and not self.internal and tenant:
            self.internal = explicit_session(tenant, session)
        self.client_id = session if session and not self.internal else None

    @property
    def store_filter(self) -> str | None:
        return self.internal

    def matches(self, event: dict[str, Any]) -> bool:
        if self.client_id is None:
            return True
        tenant, session = event.get("tenant"), event.get("session")
        if not isinstance(tenant, str) or not isinstance(session, str):
            return False
        wanted = explicit_session(tenant, self.client_id)
        # A session's events are kept per policy as "<session>:<policy>".
        return session == wanted or session.startswith(wanted + ":")


async def _read_new(
    store: Store, args: argparse.Namespace, sessions: SessionFilter, since: float, seen: set[str]
) -> list[dict[str, Any]]:
    """Every event from ``since`` not in ``seen`` (page after page) that matches, oldest first;
    each one read is added to ``seen``. A page is taken whole, so no event read is dropped."""
    found: list[dict[str, Any]] = []
    while True:
        page = await store.events(
            args.tenant, session=sessions.store_filter, policy=args.policy, since=since, limit=PAGE
        )
        fresh = [e for e in page if e["event_id"] not in seen]
        if not fresh:
            return found
        for event in fresh:
            seen.add(event["event_id"])
            if sessions.matches(event):
                found.append(event)
        since = max(float(e["time"]) for e in fresh)
        if len(page) < PAGE:
            return found


async def _why_nothing(store: Store, args: argparse.Namespace, since: float, where: str) -> str:
    if not await store.events(None, limit=1):
        return (
            f"no events in the store ({where}): a request records one only when a policy acts "
            "(events.record_skipped: true records the others too), and this must be the store "
            "the proxy uses (pass the same --config)"
        )
    filters = []
    if args.session:
        filters.append(f"session {args.session!r}")
    if args.tenant:
        filters.append(f"tenant {args.tenant!r}")
    if args.policy:
        filters.append(f"policy {args.policy!r}")
    if since:
        filters.append(f"since {datetime.datetime.fromtimestamp(since).isoformat(timespec='seconds')}")
    hint = ""
    if args.session and not args.session.startswith("s_"):
        hint = (
            "; a client's X-Session-Id is matched within its own tenant (the key it sent), "
            "so check the id's spelling, or list recent events without --session"
        )
    return f"no events match {', '.join(filters) or 'these filters'} ({where}){hint}"


async def _newest(
    store: Store, args: argparse.Namespace, sessions: SessionFilter, since: float
) -> list[dict[str, Any]]:
    """The newest ``args.limit`` events that match, newest first."""
    if sessions.client_id is None:
        return await store.events(
            args.tenant,
            session=sessions.store_filter,
            policy=args.policy,
            since=since,
            limit=args.limit,
            newest=True,
        )
    # A client's id without its tenant is matched by hash per event: the store cannot filter
    # them, so every event from ``since`` is read in order and the last ``limit`` matches kept.
    kept: deque[dict[str, Any]] = deque(await _read_new(store, args, sessions, since, set()), args.limit)
    return list(reversed(kept))


def run_events(args: argparse.Namespace, settings: Settings, store: Store) -> int:
    since = parse_since(args.since)
    sessions = SessionFilter(args.session, args.tenant)
    from proxy.state.store_factory import describe_store

    where = describe_store(settings)
    table = args.table or (not args.json and sys.stdout.isatty())
    printer = EventPrinter(sys.stdout, table)
    printed = 0

    async def run() -> None:
        nonlocal since, printed
        try:
            found = await _newest(store, args, sessions, since)
            if args.follow:
                found.reverse()  # oldest first: new events then follow below the last
            printer.write(found)
            printed = len(found)
            seen = {e["event_id"] for e in found}
            since = max([since, *(float(e["time"]) for e in found)])
            if not printed and not args.follow:
                why = await _why_nothing(store, args, since, where)
                sys.stderr.write(f"compaction-proxy events: {why}\n")
            while args.follow:
                await asyncio.sleep(args.interval)
                fresh = await _read_new(store, args, sessions, since, seen)
                printer.write(fresh)
                printed += len(fresh)
                since = max([since, *(float(e["time"]) for e in fresh)])
        finally:
            await store.close()

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(run())
    except BrokenPipeError:
        # `events | head`: the reader has what it wanted. Nothing more may be written to the
        # pipe, not even by the interpreter's own flush at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0 if printed or args.follow else 1
