"""``compaction-proxy replay tune``: search a policy's knobs on the user's own traces.

Candidates are the base policy with a few knobs changed (``extends`` + ``overrides``, as a user
would write them), each replayed as one more arm beside ``full`` and the base, through the
same proxy and the same recorded upstream as ``replay run``. A candidate is feasible when it
passes the release gate of the replay config (survival per kind against ``full``, protocol,
calls per case); the winner is the feasible candidate with the lowest effective cost (the
full-price input tokens of ``replay.session.cost``: cache hits, summarizer and read rounds included).

The search is deterministic for a seed: a sample of the knob grid first, then rounds that move
one knob of the best feasible candidate one grid step each way. Each (arm, case) is saved as
the run saves it, so a tune that is stopped resumes where it was, and a candidate already
measured is never replayed again.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

# knob: (stage, setting, grid). A knob is searched only when the base policy has its stage.
KNOBS: dict[str, tuple[str, str, tuple[float | int, ...]]] = {
    "trigger.high": ("trigger", "high", (0.6, 0.7, 0.75, 0.8, 0.85, 0.9)),
    "summarize.target": ("summarize", "target", (0.3, 0.4, 0.5, 0.6)),
    "summarize.retained_tail": ("summarize", "retained_tail", (0.1, 0.15, 0.2, 0.3)),
    "offload.keep_recent": ("offload", "keep_recent", (2, 3, 5, 8, 12)),
    "offload.clear_min_chars": ("offload", "clear_min_chars", (250, 500, 1000, 2000)),
    "offload.min_tokens": ("offload", "min_tokens", (250, 500, 1000, 2000, 4000)),
}


@dataclass(frozen=True)
class Candidate:
    """The base policy with some knobs set; ``name`` is stable for the same knobs."""

    base: str
    knobs: tuple[tuple[str, float | int], ...]

    @property
    def name(self) -> str:
        if not self.knobs:
            return self.base
        digest = hashlib.sha256(orjson.dumps([self.base, list(self.knobs)])).hexdigest()[:8]
        return f"tune_{digest}"

    def overrides(self) -> dict[str, dict[str, float | int]]:
        stages: dict[str, dict[str, float | int]] = {}
        for knob, value in self.knobs:
            stage, setting, _ = KNOBS[knob]
            stages.setdefault(stage, {})[setting] = value
        return stages

    def policy(self) -> dict[str, Any]:
        described = ", ".join(f"{k}={v}" for k, v in self.knobs)
        return {"extends": self.base, "overrides": self.overrides(), "description": f"tune: {described}"}


def searchable(base_stages: Sequence[Mapping[str, Any]]) -> dict[str, tuple[float | int, ...]]:
    """The knobs of KNOBS whose stage the base policy has, with the base's value in the grid."""
    present = {next(iter(stage)): (stage[next(iter(stage))] or {}) for stage in base_stages if stage}
    found: dict[str, tuple[float | int, ...]] = {}
    for knob, (stage, setting, grid) in KNOBS.items():
        if stage not in present:
            continue
        current = present[stage].get(setting)
        values = set(grid) | ({current} if isinstance(current, int | float) else set())
        found[knob] = tuple(sorted(values))
    return found


def base_values(base_stages: Sequence[Mapping[str, Any]], knobs: Mapping[str, Any]) -> dict[str, Any]:
    present = {next(iter(stage)): (stage[next(iter(stage))] or {}) for stage in base_stages if stage}
    values: dict[str, Any] = {}
    for knob in knobs:
        stage, setting, grid = KNOBS[knob]
        values[knob] = present[stage].get(setting, grid[len(grid) // 2])
    return values


def candidate_of(base: str, defaults: Mapping[str, Any], values: Mapping[str, Any]) -> Candidate:
    changed = tuple(sorted((k, v) for k, v in values.items() if defaults.get(k) != v))
    return Candidate(base, changed)


def sample(
    base: str, grid: Mapping[str, Sequence[Any]], defaults: Mapping[str, Any], count: int, seed: int
) -> list[Candidate]:
    """``count`` distinct candidates drawn from the grid (deterministic for ``seed``)."""
    rng = random.Random(seed)
    knobs = sorted(grid)
    space = 1
    for knob in knobs:
        space *= len(grid[knob])
    found: dict[str, Candidate] = {}
    attempts = 0
    while len(found) < min(count, space - 1) and attempts < count * 50:
        attempts += 1
        values = {knob: rng.choice(list(grid[knob])) for knob in knobs}
        candidate = candidate_of(base, defaults, values)
        if candidate.knobs:
            found.setdefault(candidate.name, candidate)
    return list(found.values())


def neighbours(
    candidate: Candidate, grid: Mapping[str, Sequence[Any]], defaults: Mapping[str, Any]
) -> list[Candidate]:
    """Every candidate one grid step away on one knob."""
    values = {**defaults, **dict(candidate.knobs)}
    result: list[Candidate] = []
    for knob in sorted(grid):
        options = list(grid[knob])
        index = options.index(values[knob]) if values[knob] in options else len(options) // 2
        for step in (-1, 1):
            if 0 <= index + step < len(options):
                moved = {**values, knob: options[index + step]}
                result.append(candidate_of(candidate.base, defaults, moved))
    return result


@dataclass
class Measured:
    candidate: Candidate
    figures: dict[str, Any]
    verdict: dict[str, Any]

    @property
    def effective(self) -> float:
        cost = self.figures.get("cost") or {}
        ratio = cost.get("effective_vs_full")
        return float(ratio) if isinstance(ratio, int | float) else float("inf")

    @property
    def min_survival(self) -> float:
        shares = []
        for counts in (self.figures.get("survival") or {}).values():
            total = sum(counts.values())
            if total:
                shares.append((counts.get("visible", 0) + counts.get("recoverable", 0)) / total)
        return min(shares) if shares else 0.0

    @property
    def feasible(self) -> bool:
        return bool(self.verdict.get("passed"))


def frontier(measured: Sequence[Measured]) -> list[Measured]:
    """The candidates no other beats on both effective cost (lower) and survival (higher)."""
    result = []
    for one in measured:
        dominated = any(
            other.effective <= one.effective
            and other.min_survival >= one.min_survival
            and (other.effective < one.effective or other.min_survival > one.min_survival)
            for other in measured
        )
        if not dominated:
            result.append(one)
    return sorted(result, key=lambda m: m.effective)


def best(measured: Sequence[Measured]) -> Measured | None:
    feasible = [m for m in measured if m.feasible]
    return min(feasible, key=lambda m: (m.effective, -m.min_survival, m.candidate.name), default=None)


@dataclass
class TuneState:
    """Every candidate measured so far, by name (a resumed tune reads it back)."""

    measured: dict[str, Measured] = field(default_factory=dict)


Evaluate = Callable[[list[Candidate]], dict[str, tuple[dict[str, Any], dict[str, Any]]]]


def search(
    base: str,
    base_stages: Sequence[Mapping[str, Any]],
    evaluate: Evaluate,
    *,
    trials: int,
    rounds: int,
    seed: int,
    state: TuneState | None = None,
) -> TuneState:
    """Sample ``trials`` candidates, then ``rounds`` of one-step moves from the best feasible one.
    ``evaluate`` replays a batch of candidates and returns each one's arm figures and verdict."""
    state = state or TuneState()
    grid = searchable(base_stages)
    defaults = base_values(base_stages, grid)

    def measure(batch: list[Candidate]) -> None:
        fresh = [c for c in dict.fromkeys(batch) if c.name not in state.measured]
        if not fresh:
            return
        results = evaluate(fresh)
        for candidate in fresh:
            figures, verdict = results[candidate.name]
            state.measured[candidate.name] = Measured(candidate, figures, verdict)

    measure([Candidate(base, ()), *sample(base, grid, defaults, trials, seed)])
    for _ in range(rounds):
        leader = best(list(state.measured.values()))
        if leader is None:
            break
        before = len(state.measured)
        measure(neighbours(leader.candidate, grid, defaults))
        if len(state.measured) == before:
            break
    return state
