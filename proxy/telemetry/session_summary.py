"""The session page's list: a tenant's recent sessions, summed from their compaction events.

Pure: the events come in, rows go out. A session here is what the store keys events by, one
conversation under one policy (``s_...:improved``); ``client_session`` is the ``X-Session-Id``
the client named it with, where it sent one (events recorded before it was kept lack it). Its
figures are the sums over its events: requests the policy did nothing to are counted only
when ``events.record_skipped`` records them, so before a session's first compaction point the
figures start at its first event.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from typing import Any

from proxy.config.sections import ModelSettings


class PriceColumn:
    """US dollars per million tokens by model name: one price column of the ``models`` table
    (``input_price`` unless told), the first pattern that matches and sets it."""

    def __init__(self, models: Mapping[str, ModelSettings], column: str = "input_price") -> None:
        self._patterns = [
            (pattern, getattr(entry, column))
            for pattern, entry in models.items()
            if pattern != "default" and getattr(entry, column) is not None
        ]
        default = models.get("default")
        self._default = getattr(default, column) if default is not None else None

    def per_million(self, model: object) -> float | None:
        if not isinstance(model, str):
            return self._default
        found = next((price for p, price in self._patterns if fnmatch.fnmatchcase(model, p)), None)
        return found if found is not None else self._default


def _new_row(event: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "session": event.get("session", ""),
        # The client's own X-Session-Id (bounded, as its events hold it); None when it sent none.
        "client_session": event.get("client_session"),
        "policy": event.get("policy"),
        "mode": event.get("mode"),
        "model": event.get("model"),
        "door": event.get("dialect"),
        "first": event.get("time", 0.0),
        "last": event.get("time", 0.0),
        "events": 0,
        "requests": 0,
        "tokens_sent": 0,
        "tokens_upstream": 0,
        "tokens_saved": 0,
        "compaction_points": 0,
        "reads": 0,
        "savings_usd": None,
    }


def _add(row: dict[str, Any], event: Mapping[str, Any], prices: PriceColumn) -> None:
    time = float(event.get("time") or 0.0)
    if time >= row["last"]:
        row["model"] = event.get("model") or row["model"]
    row["client_session"] = row["client_session"] or event.get("client_session")
    row["first"], row["last"] = min(row["first"], time), max(row["last"], time)
    row["events"] += 1
    row["requests"] = max(row["requests"], row["events"], int(event.get("request") or 0))
    sent, upstream = int(event.get("tokens_before") or 0), int(event.get("tokens_after") or 0)
    row["tokens_sent"] += sent
    row["tokens_upstream"] += upstream
    row["tokens_saved"] += sent - upstream
    if event.get("trigger"):
        row["compaction_points"] += 1
    reads = event.get("read_tool_output")
    if isinstance(reads, Mapping):
        row["reads"] += len(reads.get("reads") or ())
    price = prices.per_million(event.get("model"))
    if price is not None:
        row["savings_usd"] = (row["savings_usd"] or 0.0) + (sent - upstream) * price / 1e6


def summarize_sessions(
    events: Iterable[Mapping[str, Any]], prices: PriceColumn, limit: int = 50
) -> list[dict[str, Any]]:
    """The ``limit`` sessions with the newest events, newest first."""
    rows: dict[str, dict[str, Any]] = {}
    for event in events:
        key = str(event.get("session", ""))
        row = rows.get(key)
        if row is None:
            row = rows[key] = _new_row(event)
        _add(row, event, prices)
    ordered = sorted(rows.values(), key=lambda r: r["last"], reverse=True)[:limit]
    for row in ordered:
        if row["savings_usd"] is not None:
            row["savings_usd"] = round(row["savings_usd"], 6)
    return ordered
