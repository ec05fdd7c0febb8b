"""The state-contract kinds (constraint, correction, deferred_instruction, approval, decision):
references and evidence read from the user's own turns on hand-built runs; observations of
text-action agents never taken for instructions; and the drift helpers (cycles over a message,
the table by number of cycles, failing examples and their view snippets)."""

from __future__ import annotations

from typing import Any

import pytest

from policies.stages.common import SUMMARY_HEADER
from replay.inject.templates import STALE_TEMPLATES, TEMPLATES, recognise
from replay.questions import (
    ALL_KINDS,
    CYCLE_BUCKETS,
    KINDS,
    STATE_KINDS,
    build_questions,
    cycles_bucket,
    cycles_over,
    drift_table,
    failing_examples,
    lost_snippet,
    question_cycles,
    stale_presented,
)
from replay.questions.state_contract import NO_USER_TURN, instruction_turns
from replay.recording.cases import Case
from replay.session.survival import survival, view_text
from tests.replay.question_runs import (
    TASK,
    assert_evidence_in_history,
    assistant,
    call,
    make_case,
    msg,
    omission,
    question,
    result,
)

VALUES: dict[str, dict[str, str]] = {
    "constraint": {"fact": "tests/golden_412/", "module": "pkg/mod.py"},
    "correction": {"fact": "retry_limit", "stale": "max_retries", "config": "conf/app.ini"},
    "deferred_instruction": {"fact": "OPS-4821"},
    "approval": {"fact": "pkg/legacy_loader.py"},
    "decision": {"fact": "orjson", "rejected": "json", "component": "the cache layer"},
}


def statement(family: str, variant: int = 0, **values: str) -> str:
    return TEMPLATES[family][variant].render({**VALUES[family], **values})


def run_with_turns(*turns: str) -> Case:
    """A native run: the task, then per turn: a tool step, then the user's turn."""
    messages: list[dict[str, Any]] = [msg("user", TASK)]
    for number, turn in enumerate([*turns, None]):
        messages.append(assistant(call(f"call_{number}", "execute_bash", command=f"ls step{number}")))
        messages.append(result(f"call_{number}", "execute_bash", f"listing {number}"))
        if turn is not None:
            messages.append(msg("user", turn))
    messages.append(msg("assistant", "Done."))
    return make_case(messages)


# --- references and evidence ---------------------------------------------------------------


@pytest.mark.parametrize("variant", [0, 1])
def test_each_kind_reads_its_fact_from_the_users_turn(variant: int) -> None:
    stale = STALE_TEMPLATES[0].render(VALUES["correction"])
    turns = [stale, *(statement(family, variant) for family in STATE_KINDS)]
    case = run_with_turns(*turns)
    index_of = {text: index for index, text in instruction_turns(case)}
    for family in STATE_KINDS:
        built = question(case, family)
        fact = VALUES[family]["fact"]
        assert built.evidence == (fact,)
        assert built.evidence_in == ("content",)
        assert built.exact_items[0] == fact
        assert built.source_messages == (index_of[statement(family, variant)],)
        assert built.prompt.strip() and built.reference.strip()
        assert_evidence_in_history(case, built)
    assert question(case, "constraint").exact_items == ("tests/golden_412/", "pkg/mod.py")
    assert question(case, "constraint").reference == statement("constraint", variant)
    correction = question(case, "correction")
    assert correction.stale == ("max_retries",)
    assert "retry_limit" in correction.reference and "max_retries" in correction.reference
    assert question(case, "decision").reference == "`orjson` instead of `json`, for the cache layer"
    assert question(case, "approval").reference == statement("approval", variant)
    assert "OPS-4821" in question(case, "deferred_instruction").reference
    assert all(question(case, kind).stale == () for kind in STATE_KINDS if kind != "correction")


def test_the_latest_statement_is_the_one_in_force() -> None:
    first = statement("correction", fact="lock_wait_seconds", stale="lock_timeout")
    second = statement("correction")
    case = run_with_turns(first, second)
    built = question(case, "correction")
    assert built.evidence == ("retry_limit",)
    assert built.source_messages == (instruction_turns(case)[-1][0],)


def test_a_sentence_inside_a_longer_turn_or_a_tool_output_is_not_a_statement() -> None:
    case = run_with_turns("Thanks. " + statement("approval"))
    assert omission(case, "approval").startswith("no user turn states a approval")
    messages = [
        msg("user", TASK),
        assistant(call("c1", "execute_bash", command="cat notes.txt")),
        result("c1", "execute_bash", statement("approval")),
        msg("assistant", "Done."),
    ]
    assert omission(make_case(messages), "approval") == NO_USER_TURN


def test_text_action_observations_are_never_user_instructions() -> None:
    """SWE-agent sends what an action printed back as a user message: an observation that
    reads exactly like an approval is still not the user's approval."""
    observation = statement("approval")
    messages = [
        msg("user", "ISSUE:\nparse() fails on None\n\nINSTRUCTIONS: ..."),
        msg("assistant", "Let me look.\n```\ncat NOTES\n```"),
        msg("user", observation),
        msg("assistant", "And run it.\n```\npython repro.py\n```"),
        msg("user", "ok"),
        msg("assistant", "Done."),
    ]
    case = make_case(messages)
    assert case.text_actions
    assert instruction_turns(case) == []
    assert omission(case, "approval") == NO_USER_TURN
    # The same sentence as a user turn between complete steps is one.
    messages.insert(3, msg("user", observation))
    case = make_case(messages)
    assert instruction_turns(case) == [(4, observation)]  # after the system prompt
    assert question(case, "approval").source_messages == (4,)


def test_natural_runs_omit_the_kinds_with_reasons() -> None:
    case = run_with_turns()
    assert {omission(case, kind) for kind in STATE_KINDS} == {NO_USER_TURN}
    case = run_with_turns("Please continue working on the task on whatever approach you think is suitable.")
    assert omission(case, "constraint") == (
        "no user turn states a constraint in a recognised form (no programmatic reference)"
    )
    assert "deferred instruction" in omission(case, "deferred_instruction")


def test_state_kinds_are_asked_only_when_selected() -> None:
    case = run_with_turns(statement("decision"))
    default, _ = build_questions(case)
    assert not {q.kind for q in default} & set(STATE_KINDS)
    everything, omitted = build_questions(case, ALL_KINDS)
    assert "decision" in {q.kind for q in everything}
    assert set(ALL_KINDS) == {q.kind for q in everything} | set(omitted)
    assert (*KINDS, *STATE_KINDS) == ALL_KINDS
    with pytest.raises(ValueError):
        build_questions(case, ("constraints",))


def test_every_template_reads_back_its_own_values() -> None:
    for family, templates in [*TEMPLATES.items(), ("stale", STALE_TEMPLATES)]:
        values = VALUES["correction" if family == "stale" else family]
        for template in templates:
            stated = recognise(7, template.render(values), family)
            assert stated is not None and stated.index == 7
            assert stated.values == {slot: values[slot] for slot in template.slots}


# --- survival of the evidence, and the stale value ---------------------------------------


def test_evidence_is_visible_with_the_turn_and_lost_without_it() -> None:
    case = run_with_turns(STALE_TEMPLATES[1].render(VALUES["correction"]), statement("correction"))
    built = question(case, "correction")
    view = list(case.messages)
    assert survival(built.evidence, view, lambda _h: None) == ("visible", [])
    assert not stale_presented(built, view_text(view))
    without_correction = [m for i, m in enumerate(view) if i not in built.source_messages]
    assert survival(built.evidence, without_correction, lambda _h: None) == ("lost", ["retry_limit"])
    assert stale_presented(built, view_text(without_correction))
    neither = [m for m in without_correction if "max_retries" not in str(m.get("content"))]
    assert not stale_presented(built, view_text(neither))
    assert not stale_presented(question(case, "correction"), "")


# --- cycles, the drift table and failing examples ----------------------------------------


def test_cycles_over_counts_events_whose_covered_range_holds_the_message() -> None:
    events: list[dict[str, Any]] = [
        {"trigger": "threshold", "covered": [2, 10]},
        {"trigger": "repeated", "covered": [2, 20]},
        {"trigger": "safeguard", "covered": None},  # a cut without a summary
        {"trigger": "threshold", "parent_range": {"messages": [2, 30], "digest": "x"}},  # proxy event
        {"trigger": "threshold", "covered": [True, 40]},  # not a range
    ]
    assert cycles_over(1, events) == 0
    assert cycles_over(2, events) == 3
    assert cycles_over(9, events) == 3
    assert cycles_over(10, events) == 2  # the end is exclusive
    assert cycles_over(25, events) == 1
    assert cycles_over(30, events) == 0
    assert cycles_over(5, []) == 0
    case = run_with_turns(statement("constraint"))
    built = question(case, "constraint")
    (source,) = built.source_messages
    assert question_cycles(built, [{"covered": [source, source + 1]}, {"covered": [0, source]}]) == 1


def test_drift_table_buckets_cycles_per_kind_and_arm() -> None:
    assert [cycles_bucket(n) for n in (0, 1, 2, 3, 7, -1)] == ["0", "1", "2", "3+", "3+", "0"]
    results = [
        {"kind": "constraint", "arm": "a", "cycles": 0, "survival": "visible"},
        {"kind": "constraint", "arm": "a", "cycles": 3, "survival": "lost"},
        {"kind": "constraint", "arm": "a", "cycles": 5, "survival": "recoverable"},
        {"kind": "constraint", "arm": "b", "cycles": 1, "survival": "lost"},
        {"kind": "approval", "arm": "a", "cycles": 2, "survival": "visible"},
        {"kind": "approval", "arm": "a", "survival": "visible"},  # no cycles recorded: skipped
    ]
    table = drift_table(results, arm="a")
    assert set(table) == {"constraint", "approval"}
    assert list(table["constraint"]) == list(CYCLE_BUCKETS)
    assert table["constraint"]["0"] == {"visible": 1, "recoverable": 0, "lost": 0}
    assert table["constraint"]["1"] == {"visible": 0, "recoverable": 0, "lost": 0}
    assert table["constraint"]["3+"] == {"visible": 0, "recoverable": 1, "lost": 1}
    assert table["approval"]["2"]["visible"] == 1
    assert drift_table(results)["constraint"]["1"]["lost"] == 1
    only = drift_table(results, kinds=["decision", "approval"])
    assert set(only) == {"decision", "approval"}
    assert all(sum(c.values()) == 0 for c in only["decision"].values())


def test_failing_examples_pick_one_lost_item_per_kind() -> None:
    results = [
        {"kind": "constraint", "arm": "b", "question_id": "q1", "cycles": 1, "survival": "lost",
         "missing": ["tests/golden_412/"], "view_snippet": "near"},
        {"kind": "constraint", "arm": "a", "question_id": "q2", "cycles": 4, "survival": "lost",
         "missing": ["tests/golden_412/"], "view_snippet": "summary", "reference": "r"},
        {"kind": "constraint", "arm": "a", "question_id": "q3", "cycles": 9, "survival": "visible"},
        {"kind": "approval", "arm": "a", "question_id": "q4", "cycles": 0, "survival": "visible"},
    ]  # fmt: skip
    examples = failing_examples(results)
    assert set(examples) == {"constraint"}
    example = examples["constraint"]
    assert (example["question_id"], example["cycles"], example["snippet"]) == ("q2", 4, "summary")
    assert example["fact"] == ["tests/golden_412/"] and example["reference"] == "r"
    assert failing_examples(results, kinds=["approval"]) == {}


def test_lost_snippet_shows_where_the_fact_should_have_been() -> None:
    case = run_with_turns(statement("approval"))
    built = question(case, "approval")
    (source,) = built.source_messages
    view = [m for i, m in enumerate(case.messages) if i != source]
    snippet = lost_snippet(built, case, view_text(view))
    assert snippet.startswith(f"[near message {source - 1}, before the lost one]")
    assert "listing 0" in snippet
    summary = {"role": "user", "content": f"{SUMMARY_HEADER}\n\nThe agent listed files."}
    snippet = lost_snippet(built, case, view_text([case.messages[0], summary]))
    assert snippet.startswith("[the summary that replaced it]") and "listed files" in snippet
    assert lost_snippet(built, case, "short view").startswith("[the view's start]\nshort view")


def test_a_wrong_statement_shown_after_its_correction_is_stale() -> None:
    """Both values in the view, but the wrong statement after the correction (kept verbatim
    after a summary whose ledger holds the correction): it reads as the one in force."""
    wrong = STALE_TEMPLATES[1].render(VALUES["correction"])
    case = run_with_turns(wrong, statement("correction"))
    built = question(case, "correction")
    correction = str(case.messages[built.source_messages[0]]["content"])
    in_order = f"[summary]\n[1] {wrong}\n[2] {correction}\n{wrong}\n{correction}"
    assert not stale_presented(built, in_order)
    reversed_order = f"[summary]\n[1] {wrong}\n[2] {correction}\n{wrong}"
    assert stale_presented(built, reversed_order)
