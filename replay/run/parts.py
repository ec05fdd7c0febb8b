"""What one arm did on one case, saved as ``DIR/parts/<arm>/<case>.json``.

A part is keyed by everything that decides its figures (the arm, the case, the input's
SHA-256, the arm's policy and the replay settings that matter): a run reuses a saved part only
when its key matches, which is what makes a run resumable, lets ``--jobs`` workers write into
one run directory, and lets ``replay merge`` check the parts of ``--shard`` runs.
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from replay.config import ReplayConfig, config_builtins
from replay.recording.cases import Case

PART_VERSION = 4
# Settings that never change what an arm does on a case (the cost is computed from a part's
# request shapes when the results are built).
SETTINGS_OUTSIDE_THE_KEY = ("gate", "concurrency", "judge_model", "arms", "cache", "prices")


@dataclass(slots=True)
class CasePart:
    """What one arm did on one case: the deterministic figures and any answers."""

    arm: str
    case_id: str
    key: str
    tokens_before: list[int] = field(default_factory=list)
    tokens_after: list[int] = field(default_factory=list)
    triggers: list[str | None] = field(default_factory=list)
    stable: list[bool | None] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    compaction_events: int = 0
    summaries: int = 0
    summarizer_model_calls: int = 0
    summarizer_input_tokens: int = 0
    summarizer_output_tokens: int = 0
    summary_kinds: list[str] = field(default_factory=list)
    # Each compaction point's decisions: trigger, covered range, handles, summary hash.
    decisions: list[dict[str, Any]] = field(default_factory=list)
    questions: list[dict[str, Any]] = field(default_factory=list)
    # Every request of the session as the recorded upstream received it, as shapes for the
    # prompt-cache simulation (``replay.session.cost``, ``RecordedUpstream.take_session``).
    requests: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"version": PART_VERSION, **{k: getattr(self, k) for k in self.__slots__}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CasePart:
        return cls(**{k: v for k, v in data.items() if k in cls.__slots__})


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One (arm, case) to replay, with the key its saved part must carry."""

    arm: str
    case: Case
    key: str


def part_key(arm: str, case: Case, config: ReplayConfig, policy: Any, input_sha: str) -> str:
    relevant = {
        "arm": arm,
        "case": case.case_id,
        "input": input_sha,
        "policy": policy,
        "config": {k: v for k, v in config_builtins(config).items() if k not in SETTINGS_OUTSIDE_THE_KEY},
    }
    return hashlib.sha256(orjson.dumps(relevant, option=orjson.OPT_SORT_KEYS)).hexdigest()[:24]


def part_path(run_dir: Path, arm: str, case_id: str) -> Path:
    return run_dir / "parts" / arm / f"{case_id}.json"


def read_part(path: Path, key: str) -> CasePart | None:
    """The part saved at ``path`` if it carries ``key`` (and the current part version)."""
    if not path.exists():
        return None
    with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
        saved = orjson.loads(path.read_bytes())
        if saved.get("key") == key and saved.get("version") == PART_VERSION:
            return CasePart.from_json(saved)
    return None


def write_part(path: Path, part: CasePart) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_bytes(orjson.dumps(part.to_json()))
    temporary.replace(path)
