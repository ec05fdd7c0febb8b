"""The input file read into cases and their questions, with the input's SHA-256."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from replay.questions import Question, build_questions
from replay.recording.cases import Case, Rejected, build_case
from replay.recording.rows import iter_rows


@dataclass(slots=True)
class Loaded:
    cases: list[Case]
    rejected: list[Rejected]
    questions: dict[str, list[Question]]
    omitted: dict[str, dict[str, int]]  # kind -> reason -> count
    input_sha256: str


def load_cases(
    path: Path,
    limit: int | None,
    kinds: Sequence[str],
    keep: Callable[[int], bool] | None = None,
) -> Loaded:
    """The first ``limit`` usable cases of ``path``; with ``keep``, only those whose position
    among the usable cases (0, 1, ...) it accepts. The SHA-256 covers every row read, kept or
    not, so it names the same input on every machine that reads the same file."""
    cases: list[Case] = []
    rejected: list[Rejected] = []
    questions: dict[str, list[Question]] = {}
    omitted: dict[str, dict[str, int]] = {}
    digest = hashlib.sha256()
    usable = 0
    for row_number, row in enumerate(iter_rows(path)):
        if limit is not None and usable >= limit:
            break
        digest.update(orjson.dumps(row))
        built = build_case(row, row_number)
        if isinstance(built, Rejected):
            rejected.append(built)
            continue
        position, usable = usable, usable + 1
        if keep is not None and not keep(position):
            continue
        cases.append(built)
        found, reasons = build_questions(built, kinds)
        questions[built.case_id] = found
        for kind, reason in reasons.items():
            by_reason = omitted.setdefault(kind, {})
            by_reason[reason] = by_reason.get(reason, 0) + 1
    return Loaded(cases, rejected, questions, omitted, digest.hexdigest())


def only_cases(loaded: Loaded, case_ids: set[str]) -> Loaded:
    """``loaded`` narrowed to some of its cases (what a worker process is given)."""
    return Loaded(
        cases=[c for c in loaded.cases if c.case_id in case_ids],
        rejected=[],
        questions={k: v for k, v in loaded.questions.items() if k in case_ids},
        omitted={},
        input_sha256=loaded.input_sha256,
    )
