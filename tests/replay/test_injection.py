"""The injection suite (replay/inject/injection.py): inserted user turns never break the tool-call
protocol (every injected sample row is a case, with the same steps), land where they say,
are deterministic for a seed, carry facts found nowhere else in the run, and give every
state-contract kind its question."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.conversation import message_text, parse, role
from replay.inject.injection import (
    EARLY_STEP,
    POSITIONS,
    InjectionError,
    inject,
    inject_file,
    injection_label,
    insertion_points,
)
from replay.inject.templates import FAMILIES
from replay.questions import ALL_KINDS, STATE_KINDS, build_questions
from replay.questions.state_contract import instruction_turns
from replay.recording.cases import Case, build_case
from replay.recording.rows import iter_rows
from tests.replay.question_runs import TASK, assistant, call, msg, result

ROOT = Path(__file__).resolve().parents[2]
# The 68 sample trajectories, copied into the repository (tests read nothing outside it).
SAMPLE = ROOT / "tests" / "fixtures" / "sample_trajectories.jsonl"


def _rows() -> list[dict[str, Any]]:
    return list(iter_rows(SAMPLE))


ROWS = _rows()


def _case(row: dict[str, Any]) -> Case:
    case = build_case(row, 0)
    assert isinstance(case, Case), case
    return case


def assert_clean_injection(original: dict[str, Any], injected: dict[str, Any]) -> Case:
    """The injected row is a case with the original's steps and protocol, each recorded turn is
    a user instruction at its index, between complete steps, and nothing else changed."""
    before, after = _case(original), _case(injected)
    conversation = parse(after.messages)
    assert not conversation.problems
    assert after.text_actions == before.text_actions
    assert len(after.steps) == len(before.steps)
    records = injected["injected"]
    indices = [r["message_index"] for r in records]
    assert len(after.messages) == len(before.messages) + len(records)
    turns = dict(instruction_turns(after))
    for record in records:
        index = record["message_index"]
        assert role(after.messages[index]) == "user"
        assert message_text(after.messages[index]) == record["text"] == turns[index]
        assert record["fact"] in record["text"]
        assert role(after.messages[index - 1]) in ("user", "tool")
        assert any(role(m) == "assistant" for m in after.messages[index + 1 :])
        assert index > conversation.first_user
    remaining = [m for i, m in enumerate(injected["trajectory"]) if i not in indices]
    assert remaining == original["trajectory"]
    return after


def test_every_injected_sample_row_is_a_case_with_every_kind() -> None:
    assert ROWS
    for row in ROWS:
        for position in POSITIONS:
            injected = inject(row, seed=3, positions=(position,))
            case = assert_clean_injection(row, injected)
            questions, omitted = build_questions(case, ALL_KINDS)
            by_kind = {q.kind: q for q in questions}
            assert not set(STATE_KINDS) & set(omitted), omitted
            facts = {r["family"]: r for r in injected["injected"] if r["role"] == "fact"}
            for kind in STATE_KINDS:
                assert by_kind[kind].evidence == (facts[kind]["fact"],)
                assert by_kind[kind].source_messages == (facts[kind]["message_index"],)
            stale = next(r for r in injected["injected"] if r["role"] == "stale")
            assert by_kind["correction"].stale == (stale["fact"],)
            assert stale["message_index"] < facts["correction"]["message_index"]


def test_facts_appear_nowhere_else_in_the_run() -> None:
    for row in ROWS:
        injected = inject(row, seed=11, positions=("middle",))
        original_text = json.dumps(row)
        for record in injected["injected"]:
            assert record["fact"] not in original_text, record
            holders = [m for m in injected["trajectory"] if record["fact"] in str(m["content"])]
            # A correction names the stale value it replaces; nothing else repeats a fact.
            expected = 2 if record["role"] == "stale" else 1
            assert len(holders) == expected, record


def test_positions_early_middle_late() -> None:
    row = max(ROWS, key=lambda r: len(r["trajectory"]))
    steps = {
        position: [
            r["step"] for r in inject(row, seed=1, positions=(position,))["injected"] if r["role"] == "fact"
        ]
        for position in POSITIONS
    }
    assert min(steps["early"]) == EARLY_STEP
    assert max(steps["early"]) < min(steps["middle"]) <= max(steps["middle"]) < min(steps["late"])
    assert max(steps["late"]) == len(_case(row).steps) - 1  # right before the last step
    assert steps["early"] == sorted(steps["early"]) and len(set(steps["early"])) == len(FAMILIES)


def test_deterministic_for_a_seed_and_distinct_ids() -> None:
    row = ROWS[0]
    assert inject(row, seed=5) == inject(row, seed=5)
    other = inject(row, seed=6)
    assert [r["fact"] for r in inject(row, seed=5)["injected"]] != [r["fact"] for r in other["injected"]]
    early, late = inject(row, seed=5, positions=("early",)), inject(row, seed=5, positions=("late",))
    assert early["instance_id"] == f"{row['instance_id']}--inject-early-s5"
    assert _case(early).case_id != _case(late).case_id != _case(row).case_id
    assert early["injection"]["source_instance_id"] == row["instance_id"]
    assert injection_label(early["instance_id"]) == "early"
    assert injection_label(_case(late).instance_id) == "late"
    assert injection_label(row["instance_id"]) is None
    assert row.get("injected") is None  # the input row is not changed


def test_families_and_positions_per_family() -> None:
    row = max(ROWS, key=lambda r: len(r["trajectory"]))
    injected = inject(row, seed=2, families=("approval", "decision"), positions=("late", "early"))
    records = {r["family"]: r for r in injected["injected"]}
    assert set(records) == {"approval", "decision"}
    assert records["decision"]["step"] == EARLY_STEP and records["decision"]["position"] == "early"
    assert records["approval"]["step"] > records["decision"]["step"]
    assert injected["instance_id"].endswith("--inject-mixed-s2")
    questions, omitted = build_questions(_case(injected), STATE_KINDS)
    assert {q.kind for q in questions} == {"approval", "decision"}
    assert set(omitted) == {"constraint", "correction", "deferred_instruction"}


def test_bad_arguments_are_refused() -> None:
    row = ROWS[0]
    with pytest.raises(ValueError):
        inject(row, seed=1, families=("constraints",))
    with pytest.raises(ValueError):
        inject(row, seed=1, families=("approval", "approval"))
    with pytest.raises(ValueError):
        inject(row, seed=1, families=("approval", "decision"), positions=("early", "late", "middle"))
    with pytest.raises(ValueError):
        inject(row, seed=1, positions=("soon",))
    with pytest.raises(InjectionError):
        inject(row, seed=1, positions=(10_000,))
    with pytest.raises(InjectionError):
        inject({"instance_id": "x", "trajectory": [msg("system", "s")]}, seed=1)


def _native_row(steps: int, parallel: bool) -> dict[str, Any]:
    """A run whose steps may hold two calls answered by two results."""
    messages = [msg("system", "You are an agent."), msg("user", TASK)]
    for number in range(steps):
        calls = [call(f"c{number}a", "execute_bash", command=f"ls {number}")]
        if parallel and number % 2:
            calls.append(call(f"c{number}b", "execute_bash", command=f"pwd {number}"))
        messages.append(assistant(*calls))
        messages.extend(result(c["id"], "execute_bash", f"output of step {number}") for c in calls)
    messages.append(assistant(call("fin", "finish")))
    return {"instance_id": "owner__proj-1", "repo": "owner/proj", "source": "test", "trajectory": messages}


def _text_row(steps: int) -> dict[str, Any]:
    messages = [msg("system", "You are an agent."), msg("user", "ISSUE:\nparse() fails\n")]
    for number in range(steps):
        messages.append(msg("assistant", f"Step {number}.\n```\nls {number}\n```"))
        messages.append(msg("user", f"listing {number}\n(Current directory: /proj)\nbash-$"))
    messages.append(msg("assistant", "Done.\n```\nsubmit\n```"))
    return {"instance_id": "owner__proj-2", "repo": "owner/proj", "source": "test", "trajectory": messages}


@pytest.mark.parametrize(
    "row", [_native_row(7, True), _text_row(7), *ROWS[:3]], ids=lambda r: r["instance_id"]
)
def test_every_insertion_point_keeps_the_protocol(row: dict[str, Any]) -> None:
    """Exhaustive over the insertion points: one family, or all of them, at each."""
    points = insertion_points(_case(row))
    assert points
    for position in range(len(points)):
        assert_clean_injection(row, inject(row, seed=position, families=("approval",), positions=(position,)))
        assert_clean_injection(row, inject(row, seed=position, positions=(position,)))


@settings(max_examples=60, deadline=None)
@given(
    steps=st.integers(min_value=1, max_value=9),
    parallel=st.booleans(),
    text_actions=st.booleans(),
    seed=st.integers(min_value=0, max_value=2**31),
    families=st.lists(st.sampled_from(FAMILIES), min_size=1, max_size=5, unique=True),
    data=st.data(),
)
def test_any_families_at_any_positions_keep_the_protocol(
    steps: int, parallel: bool, text_actions: bool, seed: int, families: list[str], data: st.DataObject
) -> None:
    row = _text_row(steps) if text_actions else _native_row(steps, parallel)
    points = len(insertion_points(_case(row)))
    choice = st.one_of(st.sampled_from(POSITIONS), st.integers(min_value=0, max_value=points - 1))
    positions = data.draw(st.lists(choice, min_size=len(families), max_size=len(families)))
    injected = inject(row, seed=seed, families=families, positions=positions)
    case = assert_clean_injection(row, injected)
    questions, _omitted = build_questions(case, STATE_KINDS)
    assert {q.kind for q in questions} == set(families)


def test_inject_file_writes_a_row_per_position(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    rows = [*ROWS[:2], {"instance_id": "empty", "trajectory": [msg("system", "s")]}]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    output = tmp_path / "out" / "injected.jsonl"
    summary = inject_file(source, output, seed=9)
    assert (summary.rows_in, summary.rows_out) == (3, 6)
    assert summary.skipped == {"not a usable case: no user message": 3}
    written = list(iter_rows(output))
    assert len(written) == 6
    assert len({_case(r).case_id for r in written}) == 6
    assert [r["injection"]["positions"][0] for r in written[:3]] == list(POSITIONS)
    assert written[0] == inject(ROWS[0], seed=9, positions=("early",))
