"""Room to read at tight windows: a compaction point lands the whole request (view, tools, the
answer's reserve, the read tool) under the window with the read room free; the ledger keeps to
its share of the window whatever the agent's shape; observations are never the user's words;
a user turn kept verbatim is never older than what the summary holds; a point that misses its
target does not fire again at the next step."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import pytest

from policies.budget import read_room_for
from policies.conversation import message_text, parse
from policies.handles import PATTERN
from policies.ledger import Ledger
from policies.ledger_extraction import build_ledger
from policies.ledger_records import TranscriptRecord, UserWords
from policies.pipeline import Checkpoint, PolicyOutcome, build_policy
from policies.tokens import TokenCounter
from policies.transcript import build_transcript

COUNTER = TokenCounter()
SYSTEM = {"role": "system", "content": "You are a coding agent."}
TASK = {"role": "user", "content": "Fix the failing test in tests/test_parse.py"}
IMPROVED = [
    {"trigger": {"high": 0.75}},
    {"retry_collapse": {}},
    {"offload": {"min_tokens": 1000, "keep_recent": 5, "clear_min_chars": 500, "keep_recent_steps": 1}},
    {"summarize": {"target": 0.5, "retained_tail": 0.2}},
    {"verify_guidance": {}},
]
# A real agent's tool schemas take a good part of a small window (OpenHands-like, ~600 tokens).
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name}: " + "Run a command or edit a file in the sandbox. " * 20,
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}, "path": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
    for name in ("execute_bash", "str_replace_editor", "think")
]


def step(call_id: str, command: str, size: int) -> list[dict[str, Any]]:
    text = "\n".join(f"{call_id} line {i}: value={i * 7}" for i in range(size))
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "execute_bash", "arguments": json.dumps({"command": command})},
    }
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": text + "\n[exit code 0]"},
    ]


def run_session(window: int, steps: int, size: int = 60) -> list[PolicyOutcome]:
    policy = build_policy("improved", "", IMPROVED)
    history: list[Any] = [SYSTEM, TASK]
    checkpoint: Checkpoint | None = None
    outcomes = []
    for i in range(steps):
        history += step(f"c{i}", f"pytest -k case{i}", size)
        body = {"model": "gpt-4o", "messages": list(history), "tools": TOOLS}
        outcome = asyncio.run(
            policy.apply(body, COUNTER, window=window, checkpoint=checkpoint, injected_tokens=200)
        )
        checkpoint = outcome.checkpoint
        outcomes.append(outcome)
    return outcomes


@pytest.mark.parametrize("window", [8_000, 16_000, 32_000])
def test_every_view_that_names_handles_leaves_the_read_room_free(window: int) -> None:
    room = read_room_for(window, 1000, 0.1)
    outcomes = run_session(window, steps=40 if window < 32_000 else 70)
    assert any(o.trigger for o in outcomes)
    for outcome in outcomes:
        if not outcome.checkpoint.handles:
            continue
        whole = outcome.tokens_after + 1024 + 200  # the answer's reserve and the read tool
        assert whole <= window - room, (outcome.trigger, outcome.tokens_after)


def test_a_compaction_point_lands_at_its_target_and_is_not_followed_at_once_by_another() -> None:
    outcomes = run_session(16_000, steps=60)
    points = [i for i, o in enumerate(outcomes) if o.trigger in ("threshold", "repeated")]
    assert len(points) >= 2
    for index in points:
        fact = outcomes[index].facts.summarize
        if fact is not None and fact.request_tokens:
            assert fact.request_tokens <= fact.target_tokens or fact.target_missed
    # No compaction point right after another (thrash).
    assert all(b - a > 1 for a, b in itertools.pairwise(points)), points


def test_a_missed_target_waits_for_the_read_room_before_compacting_again() -> None:
    policy = build_policy("improved", "", IMPROVED)
    history: list[Any] = [SYSTEM, TASK, *step("c0", "ls", 40)]
    checkpoint = Checkpoint(short_of_target=True, handles=("out_0123456789abcdef",), compactions=1)
    body = {"model": "gpt-4o", "messages": history, "tools": TOOLS}
    tokens = COUNTER.count_request(body).total
    # Over 0.8 x window for the whole request, under the read ceiling: no compaction point.
    window = int((tokens + 1024 + 200) / 0.82)
    outcome = asyncio.run(
        policy.apply(body, COUNTER, window=window, checkpoint=checkpoint, injected_tokens=200)
    )
    assert outcome.trigger not in ("threshold", "repeated")
    assert outcome.facts.trigger is not None and outcome.facts.trigger.threshold == window - read_room_for(
        window, 1000, 0.1
    )


def test_the_ledger_keeps_to_its_share_of_the_window_and_names_the_complete_one() -> None:
    """Many commands, errors, files and user words: the summary's ledger stays within 0.1 x
    window, and the complete ledger is saved under the handle it names."""
    history: list[Any] = [SYSTEM, TASK]
    for i in range(120):
        history += step(f"c{i}", f"python run_{i}.py --flag {'x' * 40}", 3)
        history[-1]["content"] += f"\nValueError: failure number {i} in module_{i}"
        if i % 10 == 5:
            history.append({"role": "user", "content": f"Note {i}: keep the fix minimal, " + "please " * 60})
    outcomes = []
    policy = build_policy("improved", "", IMPROVED)
    body = {"model": "gpt-4o", "messages": history}
    outcome = asyncio.run(policy.apply(body, COUNTER, window=8_000, force=True))
    outcomes.append(outcome)
    summary = next(m for m in outcome.messages or [] if message_text(m).startswith("[Summary"))
    ledger_text = message_text(summary)
    assert COUNTER.count_text(ledger_text) <= 0.1 * 8_000 + 100
    assert "the complete ledger" in ledger_text
    complete = [o for o in outcome.offloads.values() if o.description == "the complete state ledger"]
    assert len(complete) == 1 and PATTERN.search(ledger_text)
    assert "python run_0.py" in complete[0].content and "python run_0.py" not in ledger_text
    assert "Note 5:" in complete[0].content


def test_observations_sent_as_user_messages_are_never_the_users_words() -> None:
    """smolagents' ToolCallingAgent: calls as assistant text, results as user messages."""
    history: list[Any] = [SYSTEM, TASK]
    for i in range(6):
        history.append(
            {"role": "assistant", "content": f"Calling tools:\n[{{'id': 'call_{i}', 'name': 'bash'}}]"}
        )
        history.append({"role": "user", "content": f"Call id: call_{i}\nObservation:\noutput {i}"})
    history.append({"role": "assistant", "content": "Calling tools:\n[{'id': 'call_9', 'name': 'bash'}]"})
    history.append({"role": "user", "content": "Call id: call_9\nError:\nboom"})
    conversation = parse(history)
    assert conversation.text_actions and conversation.last_user == 1
    ledger = build_ledger(history, 2, len(history))
    assert ledger.user_words == ()


def test_an_earlier_kept_user_turn_moves_into_the_ledger_when_a_newer_one_arrives() -> None:
    """The last user message kept after a summary becomes, once a newer user message is
    summarized too, a ledger entry in its place in the user's words: never shown after the
    summary, where it would read as newer than the correction the summary holds."""
    policy = build_policy("improved", "", IMPROVED)
    history: list[Any] = [SYSTEM, TASK, *step("a0", "ls", 30), {"role": "user", "content": "Use port 8080."}]
    for i in range(20):
        history += step(f"a{i + 1}", f"cmd {i}", 30)
    first = asyncio.run(
        policy.apply({"model": "gpt-4o", "messages": history}, COUNTER, window=8_000, force=True)
    )
    assert first.checkpoint.pinned == (4,)
    history += [{"role": "user", "content": "Correction: use port 9090, not 8080."}]
    for i in range(20):
        history += step(f"b{i}", f"cmd b{i}", 30)
    second = asyncio.run(
        policy.apply(
            {"model": "gpt-4o", "messages": history},
            COUNTER,
            window=8_000,
            checkpoint=first.checkpoint,
            force=True,
        )
    )
    view = second.messages or []
    at = next(i for i, m in enumerate(view) if message_text(m).startswith("[Summary"))
    after = [message_text(m) for m in view[at + 1 :]]
    assert "Use port 8080." not in after
    summary = message_text(view[at])
    assert "Use port 8080." in summary
    kept = summary.index("Use port 8080.")
    assert "Correction: use port 9090" in after or summary.index("Correction: use port 9090") > kept


def test_a_transcript_names_every_earlier_one() -> None:
    older = [TranscriptRecord(f"out_{i:016x}", i * 10, i * 10 + 9, 10, 5, 100) for i in range(5)]
    transcript = build_transcript([{"role": "user", "content": "x"}], [60], older[-1].handle, older=older)
    assert transcript is not None
    assert all(r.handle in transcript.text for r in older)


def test_a_budgeted_render_is_stable_and_cuts_lists_not_handles_first() -> None:
    ledger = Ledger(goal="g", user_words=tuple(UserWords(f"word {i} " * 30) for i in range(30)))
    text, limits, complete = ledger.render_within(lambda t: len(t) < 2_000)
    again = ledger.render_within(lambda t: len(t) < 2_000)
    assert (text, limits, complete) == again
    assert complete is not None and len(text) < len(complete)


def test_a_text_action_agent_whose_observations_are_user_messages_stays_small() -> None:
    """smolagents' ToolCallingAgent shape, 120 steps at a 16k window: the ledger stays within its
    budget (no observation is copied as the user's words), no view is ever over the window, and
    the views keep the read room free."""
    policy = build_policy("improved", "", IMPROVED)
    system = {"role": "system", "content": "You are an expert assistant who solves tasks with tools. " * 40}
    history: list[Any] = [system, {"role": "user", "content": "New task:\nFix the bug in parser.py."}]
    checkpoint: Checkpoint | None = None
    ledgers, views = [], []
    for i in range(120):
        function = f"{{'name': 'bash', 'arguments': 'pytest -k t{i}'}}"
        call = f"[{{'id': 'call_{i}', 'type': 'function', 'function': {function}}}]"
        history.append({"role": "assistant", "content": f"Thought: step {i}\nCalling tools:\n{call}"})
        output = "\n".join(f"line {j} of output {i}: ok" for j in range(40 + (i % 7) * 20))
        history.append({"role": "user", "content": f"Call id: call_{i}\nObservation:\n{output}"})
        body = {"model": "gpt-4o", "messages": list(history)}
        outcome = asyncio.run(
            policy.apply(body, COUNTER, window=16_000, checkpoint=checkpoint, injected_tokens=200)
        )
        checkpoint = outcome.checkpoint
        views.append(outcome.tokens_after)
        summary = next((m for m in outcome.messages or [] if message_text(m).startswith("[Summary")), None)
        if summary is not None:
            ledgers.append(COUNTER.count_text(message_text(summary)))
            assert "User instructions" not in message_text(summary)
    assert ledgers and max(ledgers) <= 0.1 * 16_000 + 100
    room = read_room_for(16_000, 1000, 0.1)
    assert max(views) + 1024 + 200 <= 16_000 - room
    assert max(views[-20:]) <= 0.7 * 16_000


def test_aiders_few_shot_examples_and_context_pairs_are_not_the_task() -> None:
    """aider sends few-shot examples, then context as acknowledged user messages (the switch to
    the real code base, the repo map, the files), then the user's request: that request is the
    task, and the user's later messages are the user's words, never observations."""
    fence = "```"
    history: list[Any] = [
        {"role": "system", "content": "Act as an expert software developer. Use SEARCH/REPLACE blocks."},
        {"role": "user", "content": "Change get_factorial() to use math.factorial"},
        {
            "role": "assistant",
            "content": f"mathweb/app.py\n{fence}python\n<<<<<<< SEARCH\n=======\n>>>>>>> REPLACE\n{fence}",
        },
        {"role": "user", "content": "I switched to a new code base. Please don't consider the above files."},
        {"role": "assistant", "content": "Ok."},
        {
            "role": "user",
            "content": "Here are summaries of some files present in my git repository: parser.py",
        },
        {"role": "assistant", "content": "Ok, I won't try and edit those files without asking first."},
        {"role": "user", "content": "Fix the off-by-one in parser.py's tokenize()."},
        {
            "role": "assistant",
            "content": f"parser.py\n{fence}python\n<<<<<<< SEARCH\ni + 1\n=======\ni\n>>>>>>> REPLACE\n"
            + fence,
        },
        {"role": "user", "content": "Also keep the public API unchanged."},
        {
            "role": "assistant",
            "content": f"parser.py\n{fence}python\n<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE\n{fence}",
        },
    ]
    conversation = parse(history)
    assert not conversation.text_actions
    assert conversation.first_user == 7 and conversation.last_user == 9
    ledger = build_ledger(history, 8, len(history))
    assert [w.text for w in ledger.user_words] == ["Also keep the public API unchanged."]
