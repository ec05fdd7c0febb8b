"""Questions with programmatic references (replay/questions/): which kinds are built, and a
sweep over the sample trajectories checking that each evidence string is verbatim in the
recorded history. Each kind's rules, on small hand-written runs, are tested in
``test_questions_<kind>.py``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from replay.questions import KINDS, build_questions, history_texts
from replay.recording.cases import Case, build_case
from replay.recording.rows import iter_rows
from tests.replay.question_runs import call, native_run

ROOT = Path(__file__).resolve().parents[2]
# The 68 sample trajectories, copied into the repository (tests read nothing outside it).
SAMPLE = ROOT / "tests" / "fixtures" / "sample_trajectories.jsonl"


def test_kinds_select_questions_and_unknown_kinds_are_rejected() -> None:
    case = native_run(
        (call("", "execute_bash", command="python reproduce.py"), "ValueError: bad input value")
    )
    questions, omitted = build_questions(case)
    assert [q.kind for q in questions] == ["command_output", "error"]
    assert set(omitted) == {"files_changed", "first_edit"}
    assert set(KINDS) == {q.kind for q in questions} | set(omitted)
    with pytest.raises(ValueError):
        build_questions(case, ("nonsense",))


# --- sweep over the sample trajectories ----------------------------------------------------


def _sample_path() -> Path:
    return SAMPLE


def test_sweep_every_evidence_string_is_verbatim_in_the_history() -> None:
    built: Counter[str] = Counter()
    omitted: Counter[tuple[str, str]] = Counter()
    cases = 0
    for row_number, row in enumerate(iter_rows(_sample_path())):
        case = build_case(row, row_number)
        if not isinstance(case, Case):
            continue
        cases += 1
        questions, reasons = build_questions(case)
        again, _ = build_questions(case)
        assert questions == again  # deterministic
        assert len({q.question_id for q in questions}) == len(questions)
        texts = history_texts(case)
        for q in questions:
            built[q.kind] += 1
            assert q.reference.strip(), q
            assert q.evidence and all(e.strip() for e in q.evidence), q
            assert q.exact_items, q
            assert q.prompt.strip()
            assert len(q.evidence_in) == len(q.evidence)
            assert all(0 <= i < len(case.messages) for i in q.source_messages)
            for evidence, where in zip(q.evidence, q.evidence_in, strict=True):
                assert any(evidence in text for _i, w, text in texts if w == where), (
                    case.case_id,
                    q.kind,
                    evidence,
                )
        for kind, reason in reasons.items():
            omitted[kind, reason] += 1
    print(f"\n{cases} cases; questions built per kind: {dict(built)}")
    for (kind, reason), count in sorted(omitted.items()):
        print(f"  omitted {kind}: {reason} x{count}")
    assert cases
    assert sum(built.values()) >= cases  # questions on most cases
