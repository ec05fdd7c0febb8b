"""A session's summary kept as its events are written, so the sessions list reads one row a
session instead of summing thousands of events on every call.

A *rollup* is a plain dict: one event's (``rollup``) or many events' merged (``merge``). Merge
is associative and commutative (sums, min/max, the fields of the newest event win), so a
store may sum a batch in memory, then merge it into the row it keeps, in any order. Prices
are not the store's business: the tokens saved are kept per model (``saved_by_model``) and
``proxy/telemetry/session_summary.py`` prices them when the list is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The figures a rollup sums (the compaction's own: the summarizer's tokens, apart from the prompt).
SUMS = (
    "events",
    "tokens_sent",
    "tokens_upstream",
    "tokens_saved",
    "compaction_points",
    "reads",
    "compaction_input_tokens",
    "compaction_output_tokens",
)
# The fields the newest event sets (where it has them).
LATEST = ("model", "client_session", "mode", "door", "policy", "arm")


def rollup(session: str, event: Mapping[str, Any]) -> dict[str, Any]:
    """One event as a session's summary (``session``: the key the store files it under)."""
    time = float(event.get("time") or 0.0)
    sent, upstream = int(event.get("tokens_before") or 0), int(event.get("tokens_after") or 0)
    reads = event.get("read_tool_output")
    model = event.get("model")
    own = event.get("compaction_cost")
    own_input, own_output = (
        (int(own.get("input_tokens") or 0), int(own.get("output_tokens") or 0))
        if isinstance(own, Mapping)
        else (0, 0)
    )
    # A preparation's own event (``kind``: proxy/telemetry/compaction_cost.py) is no request:
    # only its compaction's own tokens (and the session's fields it names) count.
    request = not event.get("kind")
    return {
        "session": session,
        "client_session": event.get("client_session"),
        "policy": event.get("policy"),
        "mode": event.get("mode"),
        "model": model,
        "door": event.get("dialect"),
        "arm": event.get("arm"),
        "first": time,
        "last": time,
        "events": 1 if request else 0,
        "requests": max(1, int(event.get("request") or 0)) if request else 0,
        "tokens_sent": sent,
        "tokens_upstream": upstream,
        "tokens_saved": sent - upstream,
        "compaction_points": 1 if event.get("trigger") else 0,
        "reads": len(reads.get("reads") or ()) if isinstance(reads, Mapping) else 0,
        "compaction_input_tokens": own_input,
        "compaction_output_tokens": own_output,
        # [model, tokens saved] pairs: a model may be None (the price column's default).
        "saved_by_model": [[model if isinstance(model, str) else None, sent - upstream]],
    }


def merge(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """Two rollups of one session as one."""
    if old is None:
        return dict(new)
    newer, older = (new, old) if new["last"] >= old["last"] else (old, new)
    merged = dict(older)
    for name in LATEST:
        merged[name] = newer.get(name) or older.get(name)
    merged["session"] = new["session"]
    merged["first"] = min(old["first"], new["first"])
    merged["last"] = newer["last"]
    for name in SUMS:  # a row kept before a figure was summed lacks it
        merged[name] = int(old.get(name) or 0) + int(new.get(name) or 0)
    # A request number is the session's count so far; without one, each event is a request.
    merged["requests"] = max(int(old["requests"]), int(new["requests"]), merged["events"])
    saved: dict[str | None, int] = {}
    for model, tokens in [*old["saved_by_model"], *new["saved_by_model"]]:
        saved[model] = saved.get(model, 0) + int(tokens)
    merged["saved_by_model"] = [[model, tokens] for model, tokens in saved.items()]
    return merged


def merge_all(rollups: list[tuple[tuple[str, str], dict[str, Any]]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Rollups keyed by (tenant, session), merged per key."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for key, one in rollups:
        merged[key] = merge(merged.get(key), one)
    return merged
