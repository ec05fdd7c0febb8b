"""Edits are artifacts: large edit bodies in an agent's own calls are offloaded under handles
(the call stays a valid call: same id, same name, a JSON object of arguments keeping its
identifying fields), small ones stay inline, and a summary's ledger lists every edit by file,
in order, with the handle its content is saved under."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import orjson
import pytest

from policies.artifacts import edit_artifact
from policies.conversation import message_text, parse
from policies.handles import ARGUMENT_PREFIX, PATTERN, names_a_handle
from policies.ledger_extraction import build_ledger
from policies.ledger_records import EditRecord, render_edits
from policies.message_actions import call_action, text_actions
from policies.pipeline import Checkpoint, PolicyOutcome, build_policy
from policies.tokens import TokenCounter

COUNTER = TokenCounter()
SYSTEM = {"role": "system", "content": "You are a coding agent."}
TASK = {"role": "user", "content": "Fix the parser bug in src/parse.py"}
OFFLOAD_ONLY = [{"trigger": {"high": 0.01}}, {"offload": {}}]
# ``improved``, but no clearing of older outputs: the summary must do the work.
IMPROVED = [
    {"trigger": {"high": 0.8}},
    {"retry_collapse": {}},
    {"offload": {"keep_recent": None}},
    {"summarize": {"target": 0.3, "retained_tail": 0.2}},
    {"verify_guidance": {}},
]


def code(lines: int, seed: str = "v") -> str:
    return "\n".join(
        f"    {seed}_{i} = compute_{seed}({i}, factor={i % 7})  # line {i}" for i in range(lines)
    )


def edit_call(call_id: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": tool, "arguments": json.dumps(arguments)},
            }
        ],
    }


def result(call_id: str, text: str, tool: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "name": tool, "content": text}


def exchange(call_id: str, tool: str, arguments: dict[str, Any], text: str = "ok") -> list[dict[str, Any]]:
    return [edit_call(call_id, tool, arguments), result(call_id, text, tool)]


def shell(call_id: str, command: str, text: str = "done\n[exit code 0]") -> list[dict[str, Any]]:
    return exchange(call_id, "execute_bash", {"command": command}, text)


def apply(policy: Any, messages: list[Any], window: int, **kwargs: Any) -> PolicyOutcome:
    outcome: PolicyOutcome = asyncio.run(
        policy.apply({"model": "gpt-4o", "messages": messages}, COUNTER, window=window, **kwargs)
    )
    return outcome


def view_of(outcome: PolicyOutcome, messages: list[Any]) -> list[Any]:
    return outcome.messages if outcome.messages is not None else messages


def offloaded_call(
    messages: list[Any], tool: str, window: int = 200_000
) -> tuple[dict[str, Any], PolicyOutcome]:
    """Run the offload stage alone over ``messages`` (then two more steps, so the edit is not the
    newest step) and return the edit's call as the view has it."""
    edit_id = messages[-2]["tool_calls"][0]["id"]
    history = [*messages, *shell("later1", "ls"), *shell("later2", "pytest -q")]
    outcome = apply(build_policy("o", "", OFFLOAD_ONLY, safeguard=False), history, window)
    view = view_of(outcome, history)
    assert parse(view).problems == ()
    (call,) = [c for m in view if m.get("tool_calls") for c in m["tool_calls"] if c["id"] == edit_id]
    assert call["function"]["name"] == tool
    return call, outcome


def stored(outcome: PolicyOutcome, call: dict[str, Any]) -> str:
    (handle,) = set(PATTERN.findall(call["function"]["arguments"]))
    assert handle in outcome.offloads and handle in outcome.checkpoint.handles
    return outcome.offloads[handle].content


def test_a_created_10kb_file_is_offloaded_and_the_call_stays_a_valid_call() -> None:
    text = code(220)
    assert len(text) > 10_000
    arguments = {"command": "create", "path": "/repo/src/big.py", "file_text": text}
    call, outcome = offloaded_call(
        [SYSTEM, TASK, *exchange("c1", "str_replace_editor", arguments)], "str_replace_editor"
    )
    assert call["id"] == "c1" and call["type"] == "function"
    parsed = json.loads(call["function"]["arguments"])
    assert isinstance(parsed, dict)
    assert parsed["command"] == "create" and parsed["path"] == "/repo/src/big.py"
    assert parsed["file_text"].startswith(ARGUMENT_PREFIX)
    assert "str_replace_editor create /repo/src/big.py" in parsed["file_text"]
    assert text in stored(outcome, call)
    assert outcome.facts.offload is not None and outcome.facts.offload.edits == 1
    # The proxy offers the read tool: the view names the handle (in arguments only).
    assert names_a_handle(outcome.messages or [])
    # Its result still answers it.
    view = outcome.messages or []
    position = next(i for i, m in enumerate(view) if m.get("tool_calls") and m["tool_calls"][0]["id"] == "c1")
    assert view[position + 1]["tool_call_id"] == "c1"


@pytest.mark.parametrize(
    ("tool", "arguments", "kept", "bodies"),
    [
        ("Write", {"file_path": "/w/app.py", "content": code(200)}, {"file_path": "/w/app.py"}, ["content"]),
        (
            "Edit",
            {"file_path": "/w/app.py", "old_string": code(90, "old"), "new_string": code(120, "new")},
            {"file_path": "/w/app.py"},
            ["old_string", "new_string"],
        ),
        (
            "str_replace_editor",
            {"command": "str_replace", "path": "/r/a.py", "old_str": "x = 1", "new_str": code(200)},
            {"command": "str_replace", "path": "/r/a.py", "old_str": "x = 1"},
            ["new_str"],
        ),
        (
            "write_file",
            {"path": "notes/plan.md", "content": code(200)},
            {"path": "notes/plan.md"},
            ["content"],
        ),
        (
            "edit_file",
            {"path": "src/x.py", "old_string": "a", "new_string": code(200)},
            {"path": "src/x.py", "old_string": "a"},
            ["new_string"],
        ),
    ],
)
def test_editors_of_every_agent_are_offloaded_keeping_their_identifying_fields(
    tool: str, arguments: dict[str, Any], kept: dict[str, Any], bodies: list[str]
) -> None:
    call, outcome = offloaded_call([SYSTEM, TASK, *exchange("e1", tool, arguments)], tool)
    parsed = json.loads(call["function"]["arguments"])
    assert list(parsed) == list(arguments)  # same keys, same order
    for key, value in kept.items():
        assert parsed[key] == value
    saved = stored(outcome, call)
    for key in bodies:
        assert parsed[key].startswith(ARGUMENT_PREFIX)
        assert arguments[key] in saved


def test_a_multi_edit_offloads_its_nested_bodies() -> None:
    edits = [{"old_string": code(60, f"o{i}"), "new_string": code(60, f"n{i}")} for i in range(3)]
    arguments = {"file_path": "/w/m.py", "edits": edits}
    call, outcome = offloaded_call([SYSTEM, TASK, *exchange("m1", "MultiEdit", arguments)], "MultiEdit")
    parsed = json.loads(call["function"]["arguments"])
    assert parsed["file_path"] == "/w/m.py" and len(parsed["edits"]) == 3
    assert all(e["new_string"].startswith(ARGUMENT_PREFIX) for e in parsed["edits"])
    saved = stored(outcome, call)
    assert all(e["new_string"] in saved and e["old_string"] in saved for e in edits)


def test_an_apply_patch_body_is_offloaded() -> None:
    body = "\n".join(f"+line {i} of the new module" for i in range(400))
    patch = f"*** Begin Patch\n*** Add File: src/new_module.py\n{body}\n*** End Patch"
    call, outcome = offloaded_call(
        [SYSTEM, TASK, *exchange("p1", "apply_patch", {"input": patch})], "apply_patch"
    )
    parsed = json.loads(call["function"]["arguments"])
    assert parsed["input"].startswith(ARGUMENT_PREFIX) and "src/new_module.py" in parsed["input"]
    assert patch in stored(outcome, call)


@pytest.mark.parametrize("argv", [False, True])
def test_a_heredoc_body_is_offloaded_and_the_command_keeps_its_shape(argv: bool) -> None:
    body = code(200)
    script = f"cat > /repo/gen.py <<'EOF'\n{body}\nEOF\npython /repo/gen.py"
    arguments: dict[str, Any] = {"command": ["bash", "-lc", script] if argv else script}
    tool = "shell" if argv else "execute_bash"
    call, outcome = offloaded_call([SYSTEM, TASK, *exchange("h1", tool, arguments)], tool)
    parsed = json.loads(call["function"]["arguments"])
    command = parsed["command"][2] if argv else parsed["command"]
    assert command.startswith("cat > /repo/gen.py <<'EOF'\n" + ARGUMENT_PREFIX)
    assert command.endswith("\nEOF\npython /repo/gen.py")
    assert body not in command
    assert body in stored(outcome, call)
    # The vocabulary still reads the rewritten call as a write of /repo/gen.py.
    assert call_action(call).paths == ("/repo/gen.py",)


def test_small_edits_stay_inline() -> None:
    messages = [
        SYSTEM,
        TASK,
        *exchange(
            "s1", "str_replace_editor", {"command": "create", "path": "/r/a.py", "file_text": code(20)}
        ),
        *exchange("s2", "Edit", {"file_path": "/r/a.py", "old_string": "x", "new_string": code(10)}),
    ]
    history = [*messages, *shell("later", "ls"), *shell("later2", "ls -la")]
    outcome = apply(build_policy("o", "", OFFLOAD_ONLY, safeguard=False), history, 200_000)
    assert view_of(outcome, history)[2] is history[2] and view_of(outcome, history)[4] is history[4]
    assert outcome.offloads == {}


def test_text_action_edits_are_offloaded_in_their_text() -> None:
    body = code(200)
    action = (
        "I will create the module.\n\n<function=str_replace_editor>\n<parameter=command>create</parameter>\n"
        f"<parameter=path>/testbed/mod.py</parameter>\n<parameter=file_text>\n{body}\n</parameter>\n</function>"
    )
    history: list[Any] = [SYSTEM, TASK, {"role": "assistant", "content": action}]
    history.append({"role": "user", "content": "OBSERVATION:\nFile created successfully at: /testbed/mod.py"})
    for i in range(2):
        history += [
            {"role": "assistant", "content": f"Run it.\n\n```bash\npython run_{i}.py\n```"},
            {"role": "user", "content": f"OBSERVATION:\nok {i}"},
        ]
    outcome = apply(build_policy("o", "", OFFLOAD_ONLY, safeguard=False), history, 200_000)
    view = view_of(outcome, history)
    text = message_text(view[2])
    assert body not in text and ARGUMENT_PREFIX in text
    assert "<parameter=path>/testbed/mod.py</parameter>" in text and text.endswith("</function>")
    (handle,) = set(PATTERN.findall(text))
    assert body in outcome.offloads[handle].content
    # Still read as the same action on the same file.
    (found,) = text_actions(text)
    assert found.kind == "write" and found.path == "/testbed/mod.py"


def session_with_edits() -> list[Any]:
    history: list[Any] = [SYSTEM, TASK]
    history += exchange(
        "a1", "str_replace_editor", {"command": "create", "path": "/r/repro.py", "file_text": code(8, "r")}
    )
    history += shell(
        "b1", "python /r/repro.py", "Traceback (most recent call last):\nValueError: bad\n[exit code 1]"
    )
    history += exchange(
        "a2",
        "str_replace_editor",
        {"command": "str_replace", "path": "/r/src.py", "old_str": "x = 1", "new_str": "x = 2"},
    )
    history += exchange(
        "a3", "Edit", {"file_path": "/r/repro.py", "old_string": "r_1", "new_string": "r_one"}
    )
    history += exchange(
        "a4", "str_replace_editor", {"command": "create", "path": "/r/big.py", "file_text": code(220)}
    )
    for i in range(12):
        log = " ".join(f"tests/test_{i}.py::case_{j} PASSED" for j in range(20))
        history += shell(f"t{i}", f"pytest tests/test_{i}.py", f"{log}\n1 passed in 0.{i}s\n[exit code 0]")
    return history


def summary_of(view: list[Any]) -> str:
    return next(message_text(m) for m in view if message_text(m).startswith("[Summary"))


def test_the_ledger_lists_every_covered_edit_by_file_in_order_with_handles() -> None:
    history = session_with_edits()
    outcome = apply(build_policy("improved", "", IMPROVED), history, 8_000)
    summary = summary_of(view_of(outcome, history))
    repro = next(line for line in summary.splitlines() if line.startswith("- /r/repro.py"))
    assert re.search(r"edits in order: create .*handle=out_\w+, Edit .*handle=out_\w+$", repro)
    assert re.search(r"- /r/src.py .*edits in order: str_replace \d+ chars handle=out_\w+$", summary, re.M)
    assert "- /r/big.py" in summary
    # Every handle the ledger names is saved, and holds the edit's content verbatim.
    saved = {**outcome.offloads}
    first_create, first_edit = PATTERN.findall(repro)
    assert code(8, "r") in saved[first_create].content
    assert "r_one" in saved[first_edit].content
    for handle in PATTERN.findall(summary):
        assert handle in saved or handle in outcome.checkpoint.handles
    big = next(line for line in summary.splitlines() if line.startswith("- /r/big.py"))
    (big_handle,) = PATTERN.findall(big)
    assert code(220) in saved[big_handle].content


def test_without_the_knob_the_ledger_names_no_edit_handles() -> None:
    history = session_with_edits()
    stages = [dict(s) for s in IMPROVED]
    stages[2] = {"offload": {"keep_recent": None, "offload_arguments": False}}
    outcome = apply(build_policy("improved", "", stages), history, 8_000)
    summary = summary_of(view_of(outcome, history))
    assert "edits in order" not in summary
    # No edit is saved on its own (the summary's transcript still holds the messages it replaced).
    saved = [o for o in outcome.offloads.values() if not o.description.startswith("transcript:")]
    assert not any(code(8, "r") in o.content for o in saved)


def test_offloaded_calls_are_reapplied_byte_for_byte_from_the_checkpoint() -> None:
    history: list[Any] = [SYSTEM, TASK]
    history += exchange("w1", "Write", {"file_path": "/w/big.py", "content": code(200)})
    for i in range(3):
        history += shell(f"x{i}", f"echo {i}")
    policy = build_policy("o", "", [{"trigger": {"high": 0.5}}, {"offload": {}}], safeguard=False)
    first = apply(policy, history, 8_000)
    assert first.facts.offload is not None and first.facts.offload.edits == 1
    previous = view_of(first, history)
    checkpoint: Checkpoint = first.checkpoint
    for i in range(3):
        history = [*history, *shell(f"y{i}", f"echo more {i}")]
        outcome = apply(policy, history, 1_000_000, checkpoint=checkpoint)
        view = view_of(outcome, history)
        assert outcome.trigger is None
        assert orjson.dumps(view[: len(previous)]) == orjson.dumps(previous)
        previous, checkpoint = view, outcome.checkpoint


def test_edit_artifacts_read_every_agents_edit() -> None:
    cases = [
        (
            "str_replace_editor",
            {"command": "insert", "path": "/a.py", "insert_line": 3, "new_str": "x"},
            "insert",
        ),
        ("Write", {"file_path": "/a.py", "content": "x"}, "Write"),
        ("MultiEdit", {"file_path": "/a.py", "edits": [{"old_string": "a", "new_string": "b"}]}, "MultiEdit"),
        (
            "apply_patch",
            {"input": "*** Begin Patch\n*** Update File: a.py\n-x\n+y\n*** End Patch"},
            "apply_patch",
        ),
        ("execute_bash", {"command": "cat > a.py <<'EOF'\nx\nEOF"}, "heredoc"),
        ("create_file", {"path": "a.py", "content": "x"}, "create_file"),
    ]
    for tool, arguments, label in cases:
        call = edit_call("id", tool, arguments)["tool_calls"][0]
        artifact = edit_artifact(call_action(call))
        assert artifact is not None and artifact.label == label, (tool, artifact)
        assert artifact.paths and artifact.paths[0].endswith("a.py")
    assert (
        edit_artifact(call_action(edit_call("id", "execute_bash", {"command": "ls"})["tool_calls"][0]))
        is None
    )


def test_a_file_with_many_edits_lists_the_first_and_the_newest_in_order() -> None:
    edits = [EditRecord("/a.py", "str_replace", f"out_{i:016x}", 10 * i) for i in range(1, 21)]
    edits.insert(3, EditRecord("/b.py", "create", "out_" + "f" * 16, 5000))
    line = render_edits(edits, "/a.py")
    shown = PATTERN.findall(line)
    assert shown == [f"out_{i:016x}" for i in (1, 2, 3, *range(9, 21))]
    assert "str_replace 30 chars handle=out_0000000000000003, (5 more), str_replace 90 chars" in line
    assert render_edits(edits, "/b.py") == "create 5.0 KB handle=out_" + "f" * 16


def test_the_ledger_reads_text_edits_of_the_open_file_and_skips_heredoc_scripts() -> None:
    messages: list[Any] = [
        SYSTEM,
        TASK,
        {"role": "assistant", "content": "Open it.\n```\nopen src/parse.py\n```"},
        {
            "role": "user",
            "content": "[File: /repo/src/parse.py (90 lines total)]\n(Open file: /repo/src/parse.py)",
        },
        {"role": "assistant", "content": "Fix.\n```\nedit 4:4\n    return value.strip()\nend_of_edit\n```"},
        {"role": "user", "content": "File updated.\n(Open file: /repo/src/parse.py)"},
        {"role": "assistant", "content": "Check.\n```bash\npython - <<'EOF'\nprint(1)\nEOF\n```"},
        {"role": "user", "content": "1"},
    ]
    artifacts: dict[str, tuple[str, str]] = {}
    ledger = build_ledger(messages, 2, artifacts=artifacts)
    assert [(e.path, e.label) for e in ledger.edits] == [("/repo/src/parse.py", "edit")]
    (handle,) = artifacts
    assert "    return value.strip()" in artifacts[handle][0]
    assert ledger.edits[0].handle == handle
