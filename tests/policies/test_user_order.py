"""No stale facts: a message kept verbatim after a summary is never older than a user message
the summary's ledger holds. The view keeps the conversation's order: an instruction that must
stay verbatim after the summary (a pinned user message, a developer note inside the history)
brings the user's later words with it, so a correction the ledger would hold never reads as
older than what it corrects."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.conversation import FIXED_ROLES, is_harness_preamble, message_text, parse, role
from policies.pipeline import Checkpoint, Policy, PolicyOutcome, build_policy
from policies.stages.common import SUMMARY_HEADER
from policies.tokens import TokenCounter
from tests.policies.conversations import conversation, with_instructions
from tests.policies.test_user_words import SYSTEM, TASK, step

COUNTER = TokenCounter()
STAGES: list[object] = [
    {"trigger": {"high": 0.8}},
    {"offload": {}},
    {"summarize": {"target": 0.5, "retained_tail": 0.2}},
]
# A user who pins their notes: every message starting "Note:" stays verbatim.
PINNED = build_policy("pinned", "", STAGES, pin_patterns=[r"^Note:"])
WRONG = "Note: the config key to set is `max_retries` in `config/service.toml`."
CORRECTION = "Correction: the config key is `retry_limit`, not `max_retries` as I said before."


def apply(
    policy: Policy, messages: list[Any], checkpoint: Checkpoint | None, window: int = 8_000
) -> PolicyOutcome:
    outcome: PolicyOutcome = asyncio.run(
        policy.apply({"model": "gpt-4o", "messages": messages}, COUNTER, window=window, checkpoint=checkpoint)
    )
    return outcome


def view_and_origin(outcome: PolicyOutcome, messages: list[Any]) -> tuple[list[Any], tuple[int, ...]]:
    if outcome.messages is None:
        return messages, tuple(range(len(messages)))
    assert outcome.origin is not None
    return outcome.messages, outcome.origin


def stale_after_summary(messages: list[Any], outcome: PolicyOutcome) -> list[tuple[int, int]]:
    """(shown, held): an instruction shown after the summary (a user message, or a system or
    developer message from inside the history) older than a user message the summary's ledger
    holds (its covered range, not kept verbatim after it). Empty when the order is kept."""
    view, origin = view_and_origin(outcome, messages)
    checkpoint = outcome.checkpoint
    at = next((i for i, m in enumerate(view) if message_text(m).startswith(SUMMARY_HEADER)), None)
    if at is None or checkpoint.summary is None:
        return []
    conversation = parse(messages)
    start, end = checkpoint.summary_at, checkpoint.summary_at + checkpoint.covered
    turns = {s.start for s in conversation.steps if s.kind == "user"}
    held = [
        s.start
        for s in conversation.steps
        if s.start in turns
        and start <= s.start < end
        and s.start > conversation.first_user
        and s.start not in checkpoint.pinned
        and not is_harness_preamble(messages[s.start])
    ]
    if not held:
        return []
    shown = [o for m, o in zip(view[at + 1 :], origin[at + 1 :], strict=True) if o >= 0]
    return [
        (o, max(held)) for o in shown if o < max(held) and (o in turns or role(messages[o]) in FIXED_ROLES)
    ]


def corrected_history() -> list[Any]:
    """A pinned wrong statement, steps, its correction, a later request, more steps: at 8k the
    first compaction covers all three (the last one kept after the summary, the last user
    message)."""
    history: list[Any] = [SYSTEM, TASK, *step("a0"), {"role": "user", "content": WRONG}]
    history += [m for i in range(3) for m in step(f"b{i}")]
    history += [{"role": "user", "content": CORRECTION}, *step("b3")]
    history += [{"role": "user", "content": "Now run the whole test suite."}]
    history += [m for i in range(30) for m in step(f"c{i}")]
    return history


def test_a_pinned_user_message_brings_its_later_correction_after_the_summary() -> None:
    history = corrected_history()
    outcome = apply(PINNED, history, None)
    assert outcome.checkpoint.summary is not None, "the history compacts"
    view, _ = view_and_origin(outcome, history)
    texts = [message_text(m) for m in view]
    assert WRONG in texts, "a pinned message stays verbatim"
    assert stale_after_summary(history, outcome) == []
    # The correction comes with it, after it: the order the user said them in.
    assert CORRECTION in texts and texts.index(CORRECTION) > texts.index(WRONG)
    # The ledger names both in their place, as kept after it: never lost, never out of order.
    summary = next(t for t in texts if t.startswith(SUMMARY_HEADER))
    assert "(kept verbatim right after this summary) Note: the config key" in summary
    assert "(kept verbatim right after this summary) Correction: the config key" in summary


def test_the_order_holds_over_later_compactions_and_the_prefix_only_grows() -> None:
    history = corrected_history()
    checkpoint: Checkpoint | None = None
    previous: list[Any] | None = None
    compactions = 0
    for cycle in range(4):
        history += [{"role": "user", "content": f"Also check module_{cycle}.py."}]
        for i in range(24):
            history += step(f"d{cycle}_{i}")
            outcome = apply(PINNED, history, checkpoint)
            checkpoint = outcome.checkpoint
            assert stale_after_summary(history, outcome) == [], (cycle, i)
            view, _ = view_and_origin(outcome, history)
            if previous is not None and outcome.trigger is None:
                # Between compaction points the view's prefix only grows (sticky decisions).
                assert view[: len(previous)] == previous, (cycle, i)
            previous = view
        assert checkpoint.compactions > compactions, "each cycle compacts"
        compactions = checkpoint.compactions
    assert compactions >= 3


def test_a_developer_note_inside_the_history_keeps_the_order_too() -> None:
    note = {"role": "developer", "content": "Use the staging database for every test run."}
    correction = {"role": "user", "content": "Correction: use the local database, not staging."}
    history: list[Any] = [SYSTEM, TASK, *step("a0"), note, *step("a1"), correction, *step("a2")]
    history += [{"role": "user", "content": "Now run the whole test suite."}]
    history += [m for i in range(32) for m in step(f"c{i}")]
    policy = build_policy("plain", "", STAGES)
    outcome = apply(policy, history, None)
    assert outcome.checkpoint.summary is not None
    view, _ = view_and_origin(outcome, history)
    assert any(m is note for m in view) and any(m is correction for m in view)
    assert stale_after_summary(history, outcome) == []


def test_the_safeguard_fold_keeps_the_order() -> None:
    """A kept wrong statement, then its correction among the steps the token safeguard folds
    into the summary (no compaction point: a policy without a trigger)."""
    history: list[Any] = [SYSTEM, TASK, *step("p0"), {"role": "user", "content": WRONG}]
    history += [m for i in range(36) for m in step(f"p{i + 1}")]
    first = apply(PINNED, history, None)
    assert first.checkpoint.summary is not None
    history += [*step("q0", 300), {"role": "user", "content": CORRECTION}, *step("q1", 600), *step("q2", 600)]
    history += [{"role": "user", "content": "What changed?"}]
    no_trigger = build_policy("s", "", [{"summarize": {}}], pin_patterns=[r"^Note:"])
    outcome = apply(no_trigger, history, first.checkpoint)
    fact = outcome.facts.token_safeguard
    assert fact is not None and fact.summarized_messages > 0
    assert stale_after_summary(history, outcome) == []


@st.composite
def pinned_conversation(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A generated session with user turns between its steps (some of them pinned notes) and
    developer notes inside the history."""
    messages = draw(with_instructions(conversation()))
    places = [s.start for s in parse(messages).steps if s.kind in ("exchange", "assistant")]
    chosen = draw(st.lists(st.sampled_from(places), max_size=4, unique=True)) if places else []
    for number, place in enumerate(sorted(chosen, reverse=True)):
        pinned = draw(st.booleans())
        text = f"{'Note: ' if pinned else ''}user turn {number} says value_{number}"
        messages.insert(place, {"role": "user", "content": text})
    return messages


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(messages=pinned_conversation(), window=st.sampled_from([2_048, 4_000, 8_000]))
def test_no_view_shows_an_instruction_older_than_the_ledger_holds(messages: list[Any], window: int) -> None:
    """Request by request, carrying the checkpoint: in every view, no user message (nor an
    instruction from inside the history) shown after the summary is older than a user message
    the summary's ledger holds."""
    checkpoint: Checkpoint | None = None
    cuts = [i + 1 for i, m in enumerate(messages) if role(m) in ("tool", "user")]
    for end in cuts:
        history = messages[:end]
        outcome = apply(PINNED, history, checkpoint, window)
        checkpoint = outcome.checkpoint
        assert stale_after_summary(history, outcome) == [], (end, outcome.mechanisms)
