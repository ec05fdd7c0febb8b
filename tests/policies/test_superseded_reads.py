"""``superseded_reads``, one behaviour each: a file read again, or edited and read again, and a
command run again leave their older output behind its handle with a one-line note; the newest
read stays; between points only the previous request's tail changes; every agent's way of
reading a file counts; the ledger of a later summary lists the notes."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

from policies.conversation import message_text
from policies.digests import Digests
from policies.handles import PLACEHOLDER_PREFIX, is_placeholder, superseded_of
from policies.pipeline import Checkpoint, Policy, PolicyOutcome, View, apply_checkpoint, build_policy
from policies.tokens import TokenCounter

COUNTER = TokenCounter()
# improved's stages with superseded_reads after retry_collapse (a summary's ledger lists its notes).
WITH_SUMMARIES: list[dict[str, Any]] = [
    {"tail_offload": {}},
    {"trigger": {"high": 0.75}},
    {"retry_collapse": {}},
    {"superseded_reads": {}},
    {"offload": {"min_tokens": 1000, "keep_recent": 5, "clear_min_chars": 500}},
    {"summarize": {"target": 0.5, "retained_tail": 0.2}},
]


def alone(**knobs: Any) -> Policy:
    """The stage by itself (no trigger: every request is between points unless forced)."""
    return build_policy("superseded", "", [{"superseded_reads": knobs}], safeguard=False)


def file_text(path: str, lines: int = 40, marker: str = "value") -> str:
    return "\n".join(f"{n + 1:6}\t{marker}_{n} = compute({n})  # {path}" for n in range(lines))


def exchange(call_id: str, tool: str, arguments: dict[str, Any], output: str) -> list[dict[str, Any]]:
    call = {"id": call_id, "type": "function", "function": {"name": tool, "arguments": json.dumps(arguments)}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": output},
    ]


def view_file(call_id: str, path: str, output: str | None = None, **extra: Any) -> list[dict[str, Any]]:
    arguments = {"command": "view", "path": path, **extra}
    return exchange(call_id, "str_replace_editor", arguments, output or file_text(path))


def run_command(call_id: str, command: str, output: str) -> list[dict[str, Any]]:
    return exchange(call_id, "execute_bash", {"command": command}, output)


def edit_file(call_id: str, path: str) -> list[dict[str, Any]]:
    arguments = {"command": "str_replace", "path": path, "old_str": "value_1 =", "new_str": "value_1 ="}
    return exchange(call_id, "str_replace_editor", arguments, f"The file {path} has been edited.")


START: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix the bug in /repo/a.py."},
]


def apply(policy: Policy, messages: list[Any], **kwargs: Any) -> PolicyOutcome:
    body = {"model": "gpt-4o", "messages": messages}
    outcome: PolicyOutcome = asyncio.run(policy.apply(body, COUNTER, window=128_000, **kwargs))
    return outcome


def view_of(outcome: PolicyOutcome, messages: list[Any]) -> list[Any]:
    return outcome.messages if outcome.messages is not None else messages


def notes(view: list[Any]) -> dict[str, tuple[str, str, str, str]]:
    """tool_call_id (or text) -> the note's (handle, status, why, target), for every note."""
    found = {}
    for message in view:
        note = superseded_of(message_text(message))
        if note is not None:
            found[str(message.get("tool_call_id") or message_text(message))] = note
    return found


def test_a_file_read_again_leaves_a_one_line_note_with_its_handle() -> None:
    first = file_text("/repo/a.py")
    messages = [
        *START,
        *view_file("c1", "/repo/a.py", first),
        *view_file("c2", "/repo/a.py", view_range=[1, 20]),
    ]
    outcome = apply(alone(), messages)
    view = view_of(outcome, messages)
    handle, status, why, target = notes(view)["c1"]
    note = message_text(view[3])
    assert note.startswith(PLACEHOLDER_PREFIX) and "\n" not in note and is_placeholder(note)
    assert (status, why, target) == ("Superseded", "read again later", "/repo/a.py")
    # The tool result stays (its call id, its role): only its content changes.
    assert {k: v for k, v in view[3].items() if k != "content"} == {"role": "tool", "tool_call_id": "c1"}
    assert outcome.offloads[handle].content == first
    assert view[5] is messages[5]  # the newest read stays verbatim
    assert outcome.facts.superseded_reads is not None and outcome.facts.superseded_reads.reads == 1
    assert outcome.trigger is None and outcome.checkpoint.compactions == 0


def test_the_newest_read_stays_even_when_edited_unless_stale_newest() -> None:
    messages = [*START, *view_file("c1", "/repo/a.py"), *edit_file("c2", "/repo/a.py")]
    assert notes(view_of(apply(alone(), messages), messages)) == {}
    stale = apply(alone(stale_newest=True), messages)
    assert notes(view_of(stale, messages))["c1"][1:] == ("Stale", "edited after this read", "/repo/a.py")


def test_an_early_read_of_a_file_edited_since_is_read_back_from_its_handle() -> None:
    early = file_text("/repo/a.py", marker="old")
    messages = [
        *START,
        *view_file("c1", "/repo/a.py", early),
        *edit_file("c2", "/repo/a.py"),
        *run_command("c3", "python -m pytest -q", "1 passed\n" * 40),
        *view_file("c4", "/repo/a.py", file_text("/repo/a.py", marker="new")),
    ]
    outcome = apply(alone(), messages, force=True)
    handle, status, why, _ = notes(view_of(outcome, messages))["c1"]
    assert (status, why) == ("Stale", "edited and read again later")
    assert outcome.offloads[handle].content == early


def test_a_command_run_again_leaves_its_older_output_behind_its_handle() -> None:
    messages = [
        *START,
        *run_command("c1", "python -m pytest  -q", "F\n" + "E   AssertionError\n" * 30 + "exit code 1"),
        *run_command("c2", "python -m pytest -q", "." * 40 + "\n" + "1 passed\n" * 30 + "exit code 0"),
    ]
    outcome = apply(alone(), messages)
    _, status, why, target = notes(view_of(outcome, messages))["c1"]
    assert (status, why, target) == ("Superseded", "ran again later", "python -m pytest -q")
    assert "exit 1" in message_text(view_of(outcome, messages)[3])
    assert outcome.facts.superseded_reads is not None and outcome.facts.superseded_reads.commands == 1
    assert notes(view_of(apply(alone(commands=False), messages), messages)) == {}
    other = [*messages[:4], *run_command("c2", "python -m pytest -q tests/b.py", "1 passed\n" * 30)]
    assert notes(view_of(apply(alone(), other), other)) == {}


def test_reads_in_one_step_and_a_failed_later_read_supersede_nothing() -> None:
    calls = [
        {"id": f"c{n}", "type": "function", "function": {"name": "Read", "arguments": json.dumps(arguments)}}
        for n, arguments in enumerate([{"file_path": "/w/a.py"}, {"file_path": "/w/a.py", "offset": 40}])
    ]
    parallel = [
        *START,
        {"role": "assistant", "content": None, "tool_calls": calls},
        *({"role": "tool", "tool_call_id": f"c{n}", "content": file_text("/w/a.py")} for n in range(2)),
        *run_command("c9", "ls", "a.py\n" * 100),
    ]
    assert notes(view_of(apply(alone(), parallel, force=True), parallel)) == {}
    failing = [
        *START,
        *view_file("c1", "/repo/a.py"),
        *view_file("c2", "/repo/a.py", "ERROR: Invalid `view_range` parameter: [900, 950]." * 5),
    ]
    assert notes(view_of(apply(alone(), failing, force=True), failing)) == {}


def test_a_short_output_stays() -> None:
    messages = [*START, *run_command("c1", "git status", "clean"), *run_command("c2", "git status", "clean")]
    assert notes(view_of(apply(alone(), messages, force=True), messages)) == {}


def test_between_points_only_the_previous_tail_changes_and_a_point_catches_up() -> None:
    """A read deep in the prefix, superseded by the newest step, waits for a compaction point:
    the provider's cache holds it. The note is then sent byte for byte."""
    messages = [
        *START,
        *view_file("c1", "/repo/a.py"),
        *run_command("c2", "ls", "a.py\n" * 80),
        *run_command("c3", "git log -3", "commit abc\n" * 80),
        *view_file("c4", "/repo/a.py"),
    ]
    between = apply(alone(), messages)
    assert notes(view_of(between, messages)) == {}
    point = apply(alone(), messages, force=True)
    assert set(notes(view_of(point, messages))) == {"c1"}
    assert point.checkpoint.compactions == 1
    later = [*messages, *run_command("c5", "ls", "a.py\n" * 80)]
    after = apply(alone(), later, checkpoint=point.checkpoint)
    view = view_of(after, later)
    assert view[3] == view_of(point, messages)[3]
    # The tail of the previous request (c4's output) is not superseded; c2's "ls" is in the
    # cached prefix: it stays until the next point.
    assert set(notes(view)) == {"c1"}


def test_the_checkpoint_rebuilds_the_view_with_its_notes() -> None:
    history = [*START, *view_file("c1", "/repo/a.py"), *view_file("c2", "/repo/a.py")]
    outcome = apply(alone(), history)
    rebuilt = View(
        messages=list(history),
        original=history,
        origin=list(range(len(history))),
        checkpoint=outcome.checkpoint,
    )
    apply_checkpoint(rebuilt, Digests())
    assert rebuilt.messages == outcome.messages


# How each agent shows a file (the action vocabulary: policies/actions.py), as (tool, arguments).
READS = {
    "openhands": ("str_replace_editor", {"command": "view", "path": "/repo/a.py"}),
    "claude_code": ("Read", {"file_path": "/repo/a.py"}),
    "gemini_cli": ("read_file", {"file_path": "/repo/a.py"}),
    "codex_shell": ("shell", {"command": ["bash", "-lc", "cat /repo/a.py"]}),
    "codex_exec": ("exec_command", {"cmd": "sed -n 1,80p /repo/a.py"}),
    "bash_head": ("bash", {"command": "head -n 60 /repo/a.py"}),
}


@pytest.mark.parametrize("earlier", sorted(READS))
@pytest.mark.parametrize("later", ["openhands", "codex_shell"])
def test_every_agents_read_of_a_file_counts(earlier: str, later: str) -> None:
    messages = [
        *START,
        *exchange("c1", *READS[earlier], file_text("/repo/a.py")),
        *exchange("c2", *READS[later], file_text("/repo/a.py")),
    ]
    found = notes(view_of(apply(alone(), messages), messages))
    assert set(found) == {"c1"} and found["c1"][1] == "Superseded"


@pytest.mark.parametrize("action", ["```bash\ncat /testbed/a.py\n```", "```\nopen /testbed/a.py\n```"])
def test_an_agent_that_acts_in_text_reads_the_same_way(action: str) -> None:
    """mini-swe-agent's ``cat`` and SWE-agent's ``open``: the observation is the output."""
    messages = [
        *START,
        {"role": "assistant", "content": f"Looking.\n{action}"},
        {"role": "user", "content": file_text("/testbed/a.py")},
        {"role": "assistant", "content": f"Again.\n{action}"},
        {"role": "user", "content": file_text("/testbed/a.py")},
    ]
    view = view_of(apply(alone(), messages), messages)
    note = superseded_of(message_text(view[3]))
    assert note is not None and note[1:3] == ("Superseded", "read again later")
    assert view[5] is messages[5]


def test_a_code_block_in_a_tool_calling_agents_prose_runs_nothing() -> None:
    messages = [
        *START,
        *run_command("c1", "ls", "a.py\n" * 80),
        {"role": "assistant", "content": "Run it yourself:\n```bash\nls\n```"},
        {"role": "user", "content": "Go on."},
        *run_command("c2", "git diff", "diff --git\n" * 80),
    ]
    assert notes(view_of(apply(alone(), messages, force=True), messages)) == {}


def test_the_ledger_of_a_summary_lists_the_superseded_outputs() -> None:
    policy = build_policy("summaries", "", WITH_SUMMARIES)
    messages: list[Any] = list(START)
    checkpoint: Checkpoint | None = None
    summary = ""
    for n in range(30):
        messages += view_file(f"r{n}", "/repo/a.py", file_text("/repo/a.py", 30, f"v{n}"))
        messages += run_command(f"t{n}", "python -m pytest -q", f"{n} passed\n" * 30 + "exit code 0")
        body = {"model": "gpt-4o", "messages": messages}
        outcome = asyncio.run(policy.apply(body, COUNTER, window=8_192, checkpoint=checkpoint))
        checkpoint = outcome.checkpoint
        if checkpoint.summary is not None:
            summary = message_text(checkpoint.summary)
    assert "### Superseded outputs" in summary
    line = next(x for x in summary.splitlines() if x.startswith("- `/repo/a.py`: "))
    assert re.search(r"read again later: (\(\d+ earlier\) )?handle=out_", line), line
    assert any(
        re.match(r"- `python -m pytest -q`: ran again later: (\(\d+ earlier\) )?handle=out_", x)
        for x in summary.splitlines()
    )
    assert checkpoint is not None and checkpoint.ledger is not None
    assert {r.handle for r in checkpoint.ledger.superseded} <= set(checkpoint.handles)
