"""Reading the canary's records back when the store holds something else (pure).

The book is shared state any replica, an operator or a bad script can write to, and it
outlives processes: a Redis key may be missing (flushed, evicted, a restart without its
append-only file), of another type, or hold bytes that are not what a replica wrote. The rules:

- **An unreadable pause is a pause.** Something stands where the pause is kept, and the
  safe reading of a rollout's brake is "on": the policy stays held back until an operator runs
  ``canary resume``, which replaces it. Reading it as "off" would let a damaged record resume
  a rollout that a gate stopped.
- **An unreadable epoch counts from 0**: the gate then judges every session it can read, the
  larger set, never a smaller one chosen by the damage.
- **An unreadable session is left out and counted** (``unreadable_sessions`` in the report):
  one bad record never blinds the gate to the others, and the count says that it happened.
- What was damaged is named in ``damaged`` (never the bytes themselves).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import orjson

from proxy.canary.gate import ARMS, COUNTED

# The figures a session may hold besides COUNTED: numbers, and two words.
_NUMBERS = frozenset(COUNTED) | {"first", "last"}
_ANSWERS = frozenset({"tool", "final"})


def epoch_of(raw: object) -> tuple[float, str | None]:
    """The epoch, and what was wrong with it (None when it was readable or simply absent)."""
    if raw is None:
        return 0.0, None
    try:
        epoch = float(raw.decode() if isinstance(raw, bytes) else raw)  # type: ignore[arg-type]
    except (TypeError, ValueError, UnicodeDecodeError):
        return 0.0, "epoch"
    return (epoch, None) if math.isfinite(epoch) and epoch >= 0 else (0.0, "epoch")


def pause_of(raw: object) -> tuple[dict[str, Any] | None, str | None]:
    """The pause record, and what was wrong with it: anything unreadable is a pause."""
    if raw is None:
        return None, None
    try:
        record = orjson.loads(raw) if isinstance(raw, bytes | str) else None
    except orjson.JSONDecodeError:
        record = None
    if isinstance(record, dict) and isinstance(record.get("time"), int | float):
        reason = record.get("reason")
        if isinstance(reason, list) and all(isinstance(r, str) for r in reason):
            return record, None
    return {"time": 0.0, "reason": ["unreadable_pause_record"], "damaged": True}, "paused"


def state_of(epoch_raw: object, paused_raw: object, damaged: list[str] | None = None) -> dict[str, Any]:
    """The book's state from its stored epoch and pause (as stored, bytes or text)."""
    epoch, epoch_damage = epoch_of(epoch_raw)
    paused, pause_damage = pause_of(paused_raw)
    found = [d for d in (*(damaged or ()), epoch_damage, pause_damage) if d]
    return {"epoch": epoch, "paused": paused, "damaged": sorted(set(found))}


def session_of(raw: Mapping[str, Any]) -> dict[str, Any] | None:
    """A session's figures as the judge reads them, or None when they are not the book's."""
    session: dict[str, Any] = {}
    for name, value in raw.items():
        if name == "arm":
            if value not in ARMS:
                return None
            session[name] = value
        elif name == "last_answer":
            if value not in _ANSWERS:
                return None
            session[name] = value
        elif name in _NUMBERS:
            number = _number(value)
            if number is None:
                return None
            session[name] = number
        # Any other field is not the book's and is not read.
    return session if "arm" in session else None


def decoded_hash(raw: Mapping[bytes, bytes]) -> dict[str, Any] | None:
    """A Redis session hash as text, or None when its bytes are not UTF-8."""
    try:
        return {key.decode(): value.decode() for key, value in raw.items()}
    except UnicodeDecodeError:
        return None


def decoded_blob(raw: bytes) -> dict[str, Any] | None:
    """A SQLite session row's JSON, or None when it is not a JSON object."""
    try:
        found = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return found if isinstance(found, dict) else None


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
