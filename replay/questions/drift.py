"""Multi-cycle drift: how many compaction cycles passed over a question's evidence, survival
by that number, and one failing example per kind.

A cycle passes over a message when a compaction event's covered range (the client's messages
its summary replaced, ``[start, end)``) includes the message's index. Summaries are made in
cycles: each new one covers the previous summary's range plus the newly covered steps, so a
message summarized early is covered again by every later cycle. An arm that only cuts
(``n_latest``) records no covered range: its losses show at 0 cycles.

Events are the dicts the harness keeps (``CasePart.decisions``: ``covered``) or the proxy's
own events (``parent_range.messages``). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from policies.conversation import Message, message_text, parse
from policies.stages.common import SUMMARY_HEADER
from replay.questions.question import Question
from replay.recording.cases import Case

CYCLE_BUCKETS = ("0", "1", "2", "3+")
_STATES = ("visible", "recoverable", "lost")
SNIPPET_CHARS = 600
_ANCHOR_MIN_CHARS = 8
_ANCHOR_CHARS = 80
_ANCHOR_TRIES = 5


def covered_range(event: Mapping[str, Any]) -> tuple[int, int] | None:
    """``[start, end)`` of the client's messages an event's summary covers, if it has one."""
    covered = event.get("covered")
    if covered is None:
        parent = event.get("parent_range")
        covered = parent.get("messages") if isinstance(parent, Mapping) else None
    if (
        isinstance(covered, list | tuple)
        and len(covered) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in covered)
    ):
        return covered[0], covered[1]
    return None


def cycles_over(message_index: int, events: Iterable[Mapping[str, Any]]) -> int:
    """How many compaction events covered the client's message at ``message_index``."""
    count = 0
    for event in events:
        covered = covered_range(event)
        if covered is not None and covered[0] <= message_index < covered[1]:
            count += 1
    return count


def question_cycles(question: Question, events: Iterable[Mapping[str, Any]]) -> int:
    """Cycles over the question's oldest evidence message (for a state-contract kind: the
    user turn stating the fact)."""
    if not question.source_messages:
        return 0
    return cycles_over(min(question.source_messages), events)


def cycles_bucket(cycles: int) -> str:
    return CYCLE_BUCKETS[min(max(cycles, 0), len(CYCLE_BUCKETS) - 1)]


def drift_table(
    question_results: Iterable[Mapping[str, Any]],
    *,
    arm: str | None = None,
    kinds: Sequence[str] | None = None,
) -> dict[str, dict[str, dict[str, int]]]:
    """``{kind: {cycles bucket: {visible, recoverable, lost}}}`` over question results that
    carry ``cycles`` (an int) and ``survival``; only ``arm``'s when given, only ``kinds``'
    when given. Every bucket is present for every kind found, zero or not."""
    table: dict[str, dict[str, dict[str, int]]] = {}
    for wanted in kinds or ():
        table[wanted] = {bucket: dict.fromkeys(_STATES, 0) for bucket in CYCLE_BUCKETS}
    for entry in question_results:
        cycles, state, kind = entry.get("cycles"), entry.get("survival"), entry.get("kind")
        if not isinstance(cycles, int) or state not in _STATES or not isinstance(kind, str):
            continue
        if (arm is not None and entry.get("arm") != arm) or (kinds is not None and kind not in kinds):
            continue
        by_bucket = table.setdefault(kind, {b: dict.fromkeys(_STATES, 0) for b in CYCLE_BUCKETS})
        by_bucket[cycles_bucket(cycles)][state] += 1
    return table


def failing_examples(
    question_results: Iterable[Mapping[str, Any]], *, kinds: Sequence[str] | None = None
) -> dict[str, dict[str, Any]]:
    """One lost item per kind: the one over which the most cycles passed (then by arm and
    question id), with its missing fact, cycles and the view snippet recorded with it."""
    chosen: dict[str, Mapping[str, Any]] = {}
    for entry in question_results:
        kind = entry.get("kind")
        if entry.get("survival") != "lost" or not isinstance(kind, str):
            continue
        if kinds is not None and kind not in kinds:
            continue
        current = chosen.get(kind)
        if current is None or _example_order(entry) < _example_order(current):
            chosen[kind] = entry
    return {
        kind: {
            "kind": kind,
            "arm": entry.get("arm"),
            "question_id": entry.get("question_id"),
            "case_id": entry.get("case_id"),
            "fact": list(entry.get("missing") or entry.get("evidence") or []),
            "reference": entry.get("reference"),
            "cycles": entry.get("cycles"),
            "stale_presented": entry.get("stale_presented"),
            "snippet": entry.get("view_snippet") or "",
        }
        for kind, entry in sorted(chosen.items())
    }


def _example_order(entry: Mapping[str, Any]) -> tuple[int, str, str]:
    cycles = entry.get("cycles")
    return (
        -(cycles if isinstance(cycles, int) else -1),
        str(entry.get("arm")),
        str(entry.get("question_id")),
    )


def _anchor(messages: Sequence[Message], index: int) -> str | None:
    """A probe of one message: the first of its lines (long enough) that no other message of
    the run holds, so finding it in the view finds that message."""
    tried = 0
    for line in message_text(messages[index]).splitlines():
        probe = line.strip()[:_ANCHOR_CHARS]
        if len(probe) < _ANCHOR_MIN_CHARS:
            continue
        if not any(probe in message_text(m) for i, m in enumerate(messages) if i != index):
            return probe
        tried += 1
        if tried >= _ANCHOR_TRIES:
            break
    return None


def lost_snippet(question: Question, case: Case, view_text: str, chars: int = SNIPPET_CHARS) -> str:
    """The part of the final view where a lost question's evidence should have been: around
    the nearest neighbour of its source message that is still in the view, else the start of
    the summary that replaced it, else the view's start. ``view_text`` is
    ``replay.session.survival.view_text`` of the view. The first line says which. (The system
    prompt and the task, which every arm keeps, are not used as neighbours.)"""
    source = min(question.source_messages) if question.source_messages else len(case.messages)
    messages = case.messages
    conversation = parse(messages)
    # The system prompt and the task are kept by every arm: they locate nothing.
    kept = {*range(conversation.prefix_end), conversation.first_user}
    for distance in range(1, len(messages) + 1):
        for index, side in ((source - distance, "before"), (source + distance, "after")):
            if not 0 <= index < len(messages) or index in kept:
                continue
            probe = _anchor(messages, index)
            at = view_text.find(probe) if probe else -1
            if at >= 0:
                return f"[near message {index}, {side} the lost one]\n" + _around(view_text, at, chars)
    at = view_text.find(SUMMARY_HEADER)
    if at >= 0:
        return "[the summary that replaced it]\n" + view_text[at : at + chars]
    return "[the view's start]\n" + view_text[:chars]


def _around(text: str, at: int, chars: int) -> str:
    start = max(0, at - chars // 2)
    return (
        ("..." if start else "") + text[start : start + chars] + ("..." if start + chars < len(text) else "")
    )
