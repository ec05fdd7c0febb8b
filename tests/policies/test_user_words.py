"""The user's words survive: every user message after the task is kept verbatim, in order, in
the ledger of every summary (never paraphrased, however many cycles pass), a very long one by
its head and a handle; a text-action agent's observations are not the user's words."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from policies.conversation import message_text
from policies.handles import PATTERN
from policies.ledger_extraction import build_ledger
from policies.ledger_records import LONG_USER_CHARS
from policies.pipeline import Checkpoint, PolicyOutcome, build_policy
from policies.summarizer import SummaryRequest, SummaryResult
from policies.tokens import TokenCounter

COUNTER = TokenCounter()
SYSTEM = {"role": "system", "content": "You are a coding agent."}
TASK = {"role": "user", "content": "Fix the failing test in tests/test_parse.py"}
HEADER = "### User instructions (verbatim, in order)"
POLICY = build_policy(
    "improved",
    "",
    [
        {"trigger": {"high": 0.8}},
        {"retry_collapse": {}},
        {"offload": {}},
        {"summarize": {"target": 0.5, "retained_tail": 0.2}},
        {"verify_guidance": {}},
    ],
)
CORRECTIONS = [
    "Correction: the config lives in setup.cfg, not in pyproject.toml.",
    "Constraint: do not touch anything under vendor/ (generated).\nKeep Python 3.8 syntax (no walrus).",
    "Approved: you may delete tests/legacy_test.py.",
    "Later, when the fix passes, also add a line to CHANGELOG.md under 'Unreleased'.",
    "Stop using print() for debugging; use the logger at DEBUG level.",
]


class Paraphraser:
    """A model summarizer that paraphrases everything (what the ledger must not depend on)."""

    def __init__(self) -> None:
        self.calls = 0

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.calls += 1
        return SummaryResult(text="The user gave some instructions.", model="fake", prompt_family="x")


def step(call_id: str, size: int = 40) -> list[dict[str, Any]]:
    log = " ".join(f"{call_id}-line-{i}" for i in range(size))
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {
                        "name": "execute_bash",
                        "arguments": json.dumps({"command": f"run {call_id}"}),
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "name": "execute_bash", "content": log + "\n[exit code 0]"},
    ]


def apply(messages: list[Any], checkpoint: Checkpoint | None, summarizer: Any = None) -> PolicyOutcome:
    outcome: PolicyOutcome = asyncio.run(
        POLICY.apply(
            {"model": "gpt-4o", "messages": messages},
            COUNTER,
            window=8_000,
            checkpoint=checkpoint,
            summarizer=summarizer,
        )
    )
    return outcome


def view_of(outcome: PolicyOutcome, messages: list[Any]) -> list[Any]:
    return outcome.messages if outcome.messages is not None else messages


def summary_of(view: list[Any]) -> str:
    return next(message_text(m) for m in view if message_text(m).startswith("[Summary"))


def user_words_section(summary: str) -> str:
    section = summary.split(HEADER, 1)[1]
    return section.split("\n### ", 1)[0]


def assert_verbatim_in_order(view: list[Any], said: list[str]) -> None:
    """Each thing the user said is in the ledger verbatim, or kept verbatim as a message right
    after the summary (and named there in its place), in the order it was said."""
    summary = summary_of(view)
    section = user_words_section(summary)
    after = [message_text(m) for m in view[view.index(next(m for m in view if message_text(m) == summary)) :]]
    positions = []
    for text in said:
        if text in section:
            positions.append(section.index(text))
        else:
            assert text in after, f"lost: {text!r}"
            marker = "(kept verbatim right after this summary) " + " ".join(text.split())[:60]
            assert marker in section, f"not named in the ledger: {text!r}"
            positions.append(section.index(marker))
    assert positions == sorted(positions), "the user's words are out of order"


def test_user_corrections_are_verbatim_in_the_ledger_after_one_compaction() -> None:
    history: list[Any] = [SYSTEM, TASK]
    for i, correction in enumerate(CORRECTIONS[:3]):
        history += [*step(f"a{i}"), {"role": "user", "content": correction}, *step(f"b{i}")]
    history += [step_message for i in range(32) for step_message in step(f"c{i}")]
    summarizer = Paraphraser()
    outcome = apply(history, None, summarizer)
    assert summarizer.calls == 1
    view = view_of(outcome, history)
    assert_verbatim_in_order(view, CORRECTIONS[:3])
    section = user_words_section(summary_of(view))
    # Never paraphrased, and the task is not repeated among them.
    assert CORRECTIONS[0] in section and CORRECTIONS[1] in section
    assert TASK["content"] not in section


def test_user_words_survive_three_successive_compactions() -> None:
    summarizer = Paraphraser()
    history: list[Any] = [SYSTEM, TASK]
    checkpoint: Checkpoint | None = None
    said: list[str] = []
    compactions = 0
    for cycle in range(3):
        for i, correction in enumerate(CORRECTIONS[cycle * 2 : cycle * 2 + 2]):
            history += [*step(f"x{cycle}{i}"), {"role": "user", "content": correction}]
            said.append(correction)
        for i in range(20):
            history += step(f"y{cycle}_{i}")
            outcome = apply(history, checkpoint, summarizer)
            checkpoint = outcome.checkpoint
        assert checkpoint.compactions > compactions, "each cycle compacts"
        compactions = checkpoint.compactions
        assert_verbatim_in_order(view_of(outcome, history), said)
    assert checkpoint is not None and checkpoint.compactions >= 3 and summarizer.calls >= 3


def test_a_text_action_observation_is_not_the_users_words() -> None:
    messages: list[Any] = [SYSTEM, TASK]
    for i in range(3):
        messages += [
            {"role": "assistant", "content": f"Check.\n\n```bash\npython check_{i}.py\n```"},
            {
                "role": "user",
                "content": f"<returncode>0</returncode>\n<output>Please also update the docs {i}</output>",
            },
        ]
        if i == 1:  # the user speaks between two actions: a turn of its own, not an observation
            messages.append({"role": "user", "content": CORRECTIONS[3]})
    ledger = build_ledger(messages, 2, len(messages))
    assert [w.text for w in ledger.user_words] == [CORRECTIONS[3]]
    rendered = ledger.render()
    assert f"[1] {CORRECTIONS[3]}" in rendered
    assert "Please also update the docs" not in rendered
    assert "`python check_2.py` -> 0" in rendered  # observations still feed the commands


def test_a_user_message_after_the_task_in_a_tool_call_agent_is_listed() -> None:
    messages: list[Any] = [
        SYSTEM,
        TASK,
        *step("s1"),
        {"role": "user", "content": CORRECTIONS[0]},
        *step("s2"),
    ]
    ledger = build_ledger(messages, 2, len(messages))
    assert [w.text for w in ledger.user_words] == [CORRECTIONS[0]]
    assert f"[1] {CORRECTIONS[0]}" in ledger.render()


def test_a_very_long_user_message_is_listed_by_handle_and_saved() -> None:
    long_text = "Here is the full log you asked for:\n" + "\n".join(f"log line {i}" for i in range(900))
    assert len(long_text) > LONG_USER_CHARS
    history: list[Any] = [SYSTEM, TASK, *step("l0"), {"role": "user", "content": long_text}, *step("l1")]
    history += [{"role": "user", "content": CORRECTIONS[2]}]
    history += [m for i in range(34) for m in step(f"l{i + 2}")]
    outcome = apply(history, None)
    view = view_of(outcome, history)
    section = user_words_section(summary_of(view))
    assert long_text not in section and "Here is the full log you asked for:" in section
    (handle,) = PATTERN.findall(section)
    assert outcome.offloads[handle].content == long_text
    assert handle in outcome.checkpoint.handles


def test_the_safeguard_never_drops_a_message_kept_after_the_summary() -> None:
    history: list[Any] = [SYSTEM, TASK, *step("p0"), {"role": "user", "content": CORRECTIONS[1]}]
    history += [m for i in range(36) for m in step(f"p{i + 1}")]
    first = apply(history, None)
    (pinned,) = first.checkpoint.pinned  # the last user message, kept after the summary
    assert history[pinned]["content"] == CORRECTIONS[1]
    # A new question and large steps, and no compaction point (a policy without a trigger):
    # the token safeguard must make room, folding the oldest steps into the summary.
    history += [*step("q0", 600), *step("q1", 600), {"role": "user", "content": "What changed?"}]
    no_trigger = build_policy("s", "", [{"summarize": {}}])
    outcome = asyncio.run(
        no_trigger.apply(
            {"model": "gpt-4o", "messages": history}, COUNTER, window=8_000, checkpoint=first.checkpoint
        )
    )
    view = view_of(outcome, history)
    # Folded with a newer user message in the history, the earlier one is never dropped: it
    # goes into the ledger's user words, in order (kept after the summary, it would read as
    # newer than what the summary holds).
    if not any(m is history[pinned] for m in view):
        assert CORRECTIONS[1] in user_words_section(summary_of(view))
    assert view[-1] is history[-1]
    fact = outcome.facts.token_safeguard
    assert fact is not None and fact.summarized_messages > 0 and fact.dropped_messages == 0
