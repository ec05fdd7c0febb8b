"""The injection suite: real trajectories with user turns inserted that state a constraint,
a correction, a deferred instruction, an approval or a decision: what the user set, which a
compaction must keep.

Real SWE runs rarely hold such turns, so the suite adds them: each from a template of its
family (``replay.inject.templates``) whose fact is an exact token found nowhere else in the
run. A correction is preceded by the wrong statement it corrects. The result is a row in the
dataset's shape, so an injected file is just another ``replay run --input``; the state-contract
question kinds find the turns in the recorded history and ask about them.

Turns go only between complete steps: right before an assistant message of the run, after a
user turn, a complete block of tool results or a text action's observation; never between a
call and its results, never where a text-action agent would take the turn for an observation.
Positions: ``early`` (after about ``EARLY_STEP`` steps, so many compaction cycles pass over
it), ``middle``, ``late`` (just before the last steps), or an index into the insertion points.
Deterministic for a seed: the same row, seed, families and positions give the same row.
"""

from __future__ import annotations

import hashlib
import posixpath
import random
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from policies.actions import EDIT_KINDS
from policies.conversation import parse, role
from replay.inject.templates import (
    COMPONENTS,
    CONFIG_FILES,
    CONFIG_KEYS,
    DELETABLE_FILES,
    FALLBACK_MODULE,
    FAMILIES,
    LIBRARY_CHOICES,
    PROTECTED_DIR_NAMES,
    STALE,
    STALE_TEMPLATES,
    TEMPLATES,
    TICKET_PREFIXES,
)
from replay.questions import history_texts, patch_paths, repo_root
from replay.questions.recording import recorded_actions
from replay.recording.cases import Case, Rejected, build_case
from replay.recording.rows import iter_rows

POSITIONS = ("early", "middle", "late")
_SUFFIX = re.compile(r"--inject-([A-Za-z0-9]+)-s-?\d+$")
EARLY_STEP = 2
_DRAWS = 200

Position = str | int


class InjectionError(ValueError):
    """The row cannot take injected turns (rejected as a case, or no insertion point)."""


@dataclass(frozen=True, slots=True)
class Injected:
    """One inserted user turn, as recorded in the row's ``injected`` list."""

    family: str
    role: str  # "fact" (the statement asked about) or "stale" (a correction's wrong statement)
    position: Position
    message_index: int  # in the injected row's trajectory (= the case's message index)
    step: int  # assistant steps of the run before it
    fact: str
    text: str

    def to_json(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "role": self.role,
            "position": self.position,
            "message_index": self.message_index,
            "step": self.step,
            "fact": self.fact,
            "text": self.text,
        }


def insertion_points(case: Case) -> list[int]:
    """Message indices before which a user turn may be inserted: assistant messages of the run
    that start a step and follow a user turn, a complete tool-result block or an observation."""
    conversation = parse(case.messages)
    starts = {step.start for step in conversation.steps}
    return [
        index
        for index in case.steps
        if index in starts
        and index > conversation.first_user
        and role(case.messages[index - 1]) in ("user", "tool")
    ]


def _rng(seed: int, row: dict[str, Any], label: str) -> random.Random:
    identity = orjson.dumps(
        [seed, row.get("instance_id"), row.get("trajectory_id"), row.get("source"), label]
    )
    return random.Random(int.from_bytes(hashlib.blake2b(identity, digest_size=8).digest(), "big"))


@dataclass(slots=True)
class _Facts:
    """Chooses each slot's value: deterministic, and absent from the run's own text."""

    rng: random.Random
    haystack: str
    touched: list[str]
    used: list[str] = field(default_factory=list)

    def unique(self, make: Callable[[], str], fallback: Callable[[int], str]) -> str:
        for _ in range(_DRAWS):
            value = make()
            if self.fresh(value):
                return self.take(value)
        number = 0
        while not self.fresh(fallback(number)):
            number += 1
        return self.take(fallback(number))

    def fresh(self, value: str) -> bool:
        return value not in self.haystack and not any(value in u or u in value for u in self.used)

    def take(self, value: str) -> str:
        self.used.append(value)
        return value

    def module(self) -> str:
        return self.touched[0] if self.touched else FALLBACK_MODULE

    def values(self, family: str) -> dict[str, str]:
        rng = self.rng
        if family == "constraint":
            fact = self.unique(
                lambda: f"tests/{rng.choice(PROTECTED_DIR_NAMES)}_{rng.randint(100, 999)}/",
                lambda n: f"tests/protected_{n:06d}/",
            )
            return {"fact": fact, "module": self.module()}
        if family == "correction":
            pairs = list(CONFIG_KEYS)
            rng.shuffle(pairs)
            pair = next(((r, w) for r, w in pairs if self.fresh(r) and self.fresh(w)), None)
            if pair is None:
                tag = rng.randint(100, 999)
                pair = (f"retry_limit_{tag}", f"max_retries_{tag}")
            return {
                "fact": self.take(pair[0]),
                "stale": self.take(pair[1]),
                "config": rng.choice(CONFIG_FILES),
            }
        if family == "deferred_instruction":
            fact = self.unique(
                lambda: f"{rng.choice(TICKET_PREFIXES)}-{rng.randint(1000, 9999)}", lambda n: f"PRJ-{n:06d}"
            )
            return {"fact": fact}
        if family == "approval":
            folder = posixpath.dirname(self.touched[0]) if self.touched else ""
            fact = self.unique(
                lambda: posixpath.join(folder, rng.choice(DELETABLE_FILES)),
                lambda n: posixpath.join(folder, f"legacy_loader_{n}.py"),
            )
            return {"fact": fact}
        if family == "decision":
            choices = list(LIBRARY_CHOICES)
            rng.shuffle(choices)
            fresh = [(c, r) for c, r in choices if self.fresh(c)]
            if fresh:
                chosen, rejected = self.take(fresh[0][0]), fresh[0][1]
            else:
                chosen = self.unique(lambda: f"fastcodec{rng.randint(10, 99)}", lambda n: f"fastcodec_{n}")
                rejected = "json"
            return {"fact": chosen, "rejected": rejected, "component": rng.choice(COMPONENTS)}
        raise ValueError(f"unknown family {family!r} (known: {', '.join(FAMILIES)})")


def _touched_files(case: Case) -> list[str]:
    """Python files the run changed, repository-relative: those its final patch changes, else
    those its edits inside the repository touched."""
    paths = patch_paths(case.model_patch or "")
    if not paths:
        root = repo_root(case)
        edited = [
            a.action.path for a in recorded_actions(case) if a.action.kind in EDIT_KINDS and a.action.path
        ]
        prefix = root.rstrip("/") + "/" if root else None
        paths = list(dict.fromkeys(p[len(prefix) :] for p in edited if prefix and p.startswith(prefix)))
    # Package modules first; tests and top-level scripts (a reproduction script) last.
    return sorted((p for p in paths if p.endswith(".py")), key=lambda p: ("test" in p.lower(), "/" not in p))


def _anchor(position: Position, points: int, group: int) -> int:
    """Index into the insertion points of a group of ``group`` turns at ``position``."""
    if isinstance(position, int):
        if not 0 <= position < points:
            raise InjectionError(f"position {position}: the run has {points} insertion points")
        return position
    if position == "early":
        return min(EARLY_STEP, points - 1)
    if position == "middle":
        return max(0, (points - group) // 2)
    if position == "late":
        return max(0, points - group)
    raise ValueError(f"unknown position {position!r} (known: {', '.join(POSITIONS)} or an index)")


def injection_label(instance_id: str) -> str | None:
    """The position label (``early``, ``middle``, ``late``, an index, or ``mixed``) an injected
    row's instance id carries; None for a row not injected."""
    match = _SUFFIX.search(instance_id)
    return match.group(1) if match else None


def _label(positions: Sequence[Position]) -> str:
    distinct = list(dict.fromkeys(str(p) for p in positions))
    return distinct[0] if len(distinct) == 1 else "mixed"


def inject(
    row: dict[str, Any],
    *,
    seed: int,
    families: Sequence[str] = FAMILIES,
    positions: Sequence[Position] = ("early",),
) -> dict[str, Any]:
    """A copy of ``row`` with one user turn per family inserted (a correction also gets its
    earlier wrong statement). ``positions``: one for every family, or one per family. Turns
    of the same position go at consecutive insertion points, in an order drawn from the seed.
    Records ``injected`` (each turn: family, role, position, message_index, step, fact, text)
    and ``injection`` (seed, families, positions, the original ids); suffixes the ids."""
    families = list(families)
    unknown = [f for f in families if f not in FAMILIES]
    if unknown or len(set(families)) != len(families) or not families:
        raise ValueError(
            f"families: each of {', '.join(FAMILIES)} at most once, at least one; got {families}"
        )
    if len(positions) not in (1, len(families)):
        raise ValueError("positions: one for every family, or one per family")
    per_family: list[Position] = list(positions) * len(families) if len(positions) == 1 else list(positions)
    case = build_case(row, 0)
    if isinstance(case, Rejected):
        raise InjectionError(f"not a usable case: {case.reason}")
    points = insertion_points(case)
    if not points:
        raise InjectionError("no insertion point between complete steps")
    label = _label(per_family)
    rng = _rng(seed, row, label)
    haystack = "\n".join(text for _i, _w, text in history_texts(case)) + "\n" + (case.model_patch or "")
    facts = _Facts(rng, haystack, _touched_files(case))
    planned = _plan(families, per_family, len(points), rng, facts)
    injected_trajectory, records = _inserted(list(row.get("trajectory") or []), points, planned, case)
    suffix = _suffix(label, seed)
    result = dict(row)
    result["trajectory"] = injected_trajectory
    result["instance_id"] = f"{row.get('instance_id') or 'row'}{suffix}"
    if row.get("trajectory_id") is not None:
        result["trajectory_id"] = f"{row['trajectory_id']}{suffix}"
    result["injected"] = [record.to_json() for record in records]
    result["injection"] = {
        "seed": seed,
        "families": families,
        "positions": per_family,
        "source_instance_id": row.get("instance_id"),
        "source_trajectory_id": row.get("trajectory_id"),
    }
    return result


# (point index, order, family, role, position, fact, text) of one turn to insert.
Planned = tuple[int, int, str, str, Position, str, str]


def _plan(
    families: Sequence[str], per_family: Sequence[Position], points: int, rng: random.Random, facts: _Facts
) -> list[Planned]:
    """The turns to insert, at which insertion point, ordered as they are inserted."""
    planned: list[Planned] = []
    groups: dict[str, list[int]] = {}
    for number, position in enumerate(per_family):
        groups.setdefault(str(position), []).append(number)
    for members in groups.values():
        position = per_family[members[0]]
        anchor = _anchor(position, points, len(members))
        # The order within a position is drawn too: the most recent user turn is the one a
        # policy keeps verbatim, and no family should always be it.
        order = list(members)
        rng.shuffle(order)
        for rank, number in enumerate(order):
            family = families[number]
            values = facts.values(family)
            at = min(anchor + rank, points - 1)
            text = rng.choice(TEMPLATES[family]).render(values)
            planned.append((at, len(planned), family, "fact", position, values["fact"], text))
            if family == "correction":
                stale_at = max(0, anchor - 1)
                stale_text = rng.choice(STALE_TEMPLATES).render(values)
                # First at its point: before the correction even when both share one.
                planned.append((stale_at, -1, family, STALE, position, values["stale"], stale_text))
    planned.sort(key=lambda item: (item[0], item[1]))
    return planned


def _inserted(
    trajectory: list[Any], points: Sequence[int], planned: Sequence[Planned], case: Case
) -> tuple[list[Any], list[Injected]]:
    """The trajectory with the planned user turns in place, and what was inserted where."""
    by_point: dict[int, list[Planned]] = {}
    for item in planned:
        by_point.setdefault(points[item[0]], []).append(item)
    injected_trajectory: list[Any] = []
    records: list[Injected] = []
    for index, message in enumerate(trajectory):
        for _at, _order, family, turn_role, position, fact, text in by_point.get(index, []):
            step = sum(1 for s in case.steps if s < index)
            records.append(Injected(family, turn_role, position, len(injected_trajectory), step, fact, text))
            injected_trajectory.append(_user_message(text))
        injected_trajectory.append(message)
    return injected_trajectory, records


def _suffix(label: str, seed: int) -> str:
    return f"--inject-{label}-s{seed}"


def _user_message(text: str) -> dict[str, Any]:
    """A user turn in the row shape: all five keys, null where they do not apply."""
    return {"content": text, "name": None, "role": "user", "tool_call_id": None, "tool_calls": None}


@dataclass(frozen=True, slots=True)
class InjectionSummary:
    rows_in: int
    rows_out: int
    skipped: dict[str, int]  # reason -> rows x positions not injected


def inject_file(
    input: str | Path,
    output: str | Path,
    seed: int,
    families: Sequence[str] = FAMILIES,
    positions: Sequence[Position] = POSITIONS,
) -> InjectionSummary:
    """Writes, for every row of ``input`` and every position, the row with every family
    injected at that position (a JSON-lines file in the row shape); rows that cannot take
    turns are skipped and counted by reason."""
    rows_in = rows_out = 0
    skipped: Counter[str] = Counter()
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    temporary = output.with_suffix(output.suffix + ".tmp")
    with temporary.open("wb") as handle:
        for row in iter_rows(input):
            rows_in += 1
            for position in positions:
                try:
                    injected = inject(row, seed=seed, families=families, positions=(position,))
                except InjectionError as error:
                    skipped[str(error)] += 1
                    continue
                handle.write(orjson.dumps(injected) + b"\n")
                rows_out += 1
    temporary.replace(output)
    return InjectionSummary(rows_in, rows_out, dict(skipped))
