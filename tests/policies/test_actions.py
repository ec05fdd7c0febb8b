"""The shared action vocabulary: every major agent's tools read as the same few actions, and
the ledger built on it (goal = the task, observations never taken for instructions)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from policies.actions import (
    EDIT,
    FINISH,
    OTHER,
    PATCH,
    PLAN,
    READ,
    SEARCH,
    SHELL,
    WRITE,
    classify,
)
from policies.ledger_extraction import build_ledger
from policies.message_actions import actions_of, text_actions

PATCH_TEXT = (
    "*** Begin Patch\n*** Update File: src/app.py\n@@ def main():\n-    return 1\n+    return 2\n"
    "*** Add File: tests/test_app.py\n+def test_main():\n+    assert main() == 2\n*** End Patch"
)

# (agent, tool, arguments, kind, target, files written)
CASES: list[tuple[str, str, dict[str, Any], str, str, tuple[str, ...]]] = [
    ("openhands", "execute_bash", {"command": "pytest -q  tests"}, SHELL, "pytest -q tests", ()),
    (
        "openhands",
        "str_replace_editor",
        {"command": "str_replace", "path": "/r/a.py", "old_str": "x = 1", "new_str": "x = 2"},
        EDIT,
        "/r/a.py",
        (),
    ),
    ("openhands", "str_replace_editor", {"command": "view", "path": "/r/a.py"}, READ, "/r/a.py", ()),
    (
        "openhands",
        "str_replace_editor",
        {"command": "create", "path": "/r/new.py", "file_text": "print(1)"},
        WRITE,
        "/r/new.py",
        (),
    ),
    ("swe-agent", "bash", {"command": "python reproduce.py"}, SHELL, "python reproduce.py", ()),
    ("swe-agent", "submit", {}, FINISH, "", ()),
    ("mini-swe-agent", "bash", {"command": "cat > fix.py <<'EOF'\nx = 1\nEOF"}, SHELL, "", ("fix.py",)),
    ("claude-code", "Bash", {"command": "ls -la", "description": "List"}, SHELL, "ls -la", ()),
    (
        "claude-code",
        "Read",
        {"file_path": "/w/README.md", "offset": 1, "limit": 20},
        READ,
        "/w/README.md",
        (),
    ),
    (
        "claude-code",
        "Edit",
        {"file_path": "/w/a.py", "old_string": "a", "new_string": "b", "replace_all": False},
        EDIT,
        "/w/a.py",
        (),
    ),
    (
        "claude-code",
        "MultiEdit",
        {"file_path": "/w/a.py", "edits": [{"old_string": "a", "new_string": "b"}]},
        EDIT,
        "/w/a.py",
        (),
    ),
    ("claude-code", "Write", {"file_path": "/w/b.py", "content": "print(2)"}, WRITE, "/w/b.py", ()),
    ("claude-code", "Grep", {"pattern": "def main", "path": "src"}, SEARCH, "def main in src", ()),
    ("claude-code", "Glob", {"pattern": "**/*.py"}, SEARCH, "**/*.py", ()),
    ("codex", "shell", {"command": ["bash", "-lc", "sed -n 1,20p src/app.py"]}, SHELL, "", ()),
    ("codex", "shell", {"command": ["ls", "-la", "my dir"]}, SHELL, "ls -la 'my dir'", ()),
    ("codex", "exec_command", {"cmd": "cargo test", "workdir": "/w"}, SHELL, "cargo test", ()),
    ("codex", "apply_patch", {"input": PATCH_TEXT}, PATCH, "src/app.py, tests/test_app.py", ()),
    ("gemini-cli", "run_shell_command", {"command": "ls -la", "description": "List"}, SHELL, "ls -la", ()),
    ("gemini-cli", "read_file", {"file_path": "/w/README.md"}, READ, "/w/README.md", ()),
    ("gemini-cli", "read_many_files", {"include": ["src/*.py"]}, READ, "", ()),
    ("gemini-cli", "write_file", {"file_path": "/w/b.py", "content": "print(2)"}, WRITE, "/w/b.py", ()),
    (
        "gemini-cli",
        "replace",
        {"file_path": "/w/a.py", "old_string": "a", "new_string": "b", "instruction": "rename"},
        EDIT,
        "/w/a.py",
        (),
    ),
    ("gemini-cli", "glob", {"pattern": "**/*.py"}, SEARCH, "**/*.py", ()),
    ("gemini-cli", "grep_search", {"pattern": "def main", "dir_path": "src"}, SEARCH, "", ()),
    ("gemini-cli", "search_file_content", {"pattern": "def main"}, SEARCH, "", ()),
    ("gemini-cli", "list_directory", {"dir_path": "/w"}, SEARCH, "", ()),
    ("generic", "run_it", {"cmd": "make check"}, SHELL, "make check", ()),
    ("generic", "patcher", {"diff": PATCH_TEXT}, PATCH, "src/app.py, tests/test_app.py", ()),
    ("generic", "edit_thing", {"file": "x.py", "old_string": "p", "new_string": "q"}, EDIT, "x.py", ()),
    ("generic", "save", {"filename": "notes.md", "content": "hello"}, WRITE, "notes.md", ()),
    ("generic", "lookup", {"query": "weather"}, OTHER, "weather", ()),
]


@pytest.mark.parametrize(("agent", "tool", "args", "kind", "target", "writes"), CASES)
def test_every_agents_tools_read_as_the_same_actions(
    agent: str, tool: str, args: dict[str, Any], kind: str, target: str, writes: tuple[str, ...]
) -> None:
    action = classify(tool, args)
    assert action.kind == kind, agent
    if target:
        assert action.target == target
    assert action.paths[: len(writes)] == writes or not writes


def test_codex_shell_argv_is_unwrapped_and_its_reads_are_seen() -> None:
    action = classify("shell", {"command": ["bash", "-lc", "sed -n 1,20p src/app.py"]})
    assert action.command == "sed -n 1,20p src/app.py"
    assert action.path == "src/app.py"  # shown, not written


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        ("cat -n src/app.py", "src/app.py"),
        ("head -n 60 src/app.py", "src/app.py"),
        ("tail -n 20 logs/out.txt", "logs/out.txt"),
        ("head -c 100 src/app.py", "src/app.py"),
        ("head -20 src/app.py", "src/app.py"),
        ("sed -n 1,9p src/app.py", "src/app.py"),
        ("head -n 5 a.py b.py", None),  # two files: not one file shown
        ("tail -f logs/out.txt | grep x", None),
    ],
)
def test_a_shell_command_that_shows_one_file_reads_it(command: str, shown: str | None) -> None:
    assert classify("bash", {"command": command}).path == shown


def test_patches_name_every_file_and_their_new_code() -> None:
    action = classify("apply_patch", {"input": PATCH_TEXT})
    assert action.paths == ("src/app.py", "tests/test_app.py")
    assert "    return 2" in (action.code or "") and "    return 1" not in (action.code or "")
    heredoc = classify("shell", {"command": ["bash", "-lc", f"apply_patch <<'EOF'\n{PATCH_TEXT}\nEOF"]})
    assert heredoc.kind == SHELL and heredoc.paths == ("src/app.py", "tests/test_app.py")


def test_plans_of_every_agent_give_open_items() -> None:
    todo = classify(
        "TodoWrite",
        {"todos": [{"content": "Fix", "status": "completed"}, {"content": "Test", "status": "pending"}]},
    )
    tracker = classify(
        "task_tracker", {"command": "plan", "task_list": [{"title": "Repro", "status": "todo"}]}
    )
    codex = classify("update_plan", {"plan": [{"step": "Ship", "status": "in_progress"}]})
    assert (todo.kind, tracker.kind, codex.kind) == (PLAN, PLAN, PLAN)
    assert todo.open_items() == ("Test",)
    assert tracker.open_items() == ("Repro",)
    assert codex.open_items() == ("Ship",)


@pytest.mark.parametrize(
    ("text", "command"),
    [
        ("THOUGHT: look\n\n```mswea_bash_command\nls -R\n```", "ls -R"),
        ("Run:\n```bash\npytest -x\n```", "pytest -x"),
        ("DISCUSSION\nList.\n```\nls -F\n```", "ls -F"),
        ("<function=execute_bash>\n<parameter=command>\nmake\n</parameter>\n</function>", "make"),
    ],
)
def test_text_actions_of_every_text_agent(text: str, command: str) -> None:
    (action,) = text_actions(text)
    assert action.kind == SHELL and action.command == command and not action.native


def test_swe_agent_text_commands() -> None:
    (edit,) = text_actions("```\nedit 3:4\n    return 2\nend_of_edit\n```")
    assert edit.kind == EDIT and edit.code == "    return 2"
    (opened,) = text_actions("```\nopen src/app.py 40\n```")
    assert opened.kind == READ and opened.path == "src/app.py"
    (done,) = text_actions("```\nsubmit\n```")
    assert done.kind == FINISH


def test_malformed_calls_are_other_actions() -> None:
    message = {
        "role": "assistant",
        "tool_calls": [
            {"id": "a", "function": "not a mapping"},
            {"id": "b", "function": {"name": None, "arguments": "{broken"}},
            {"id": ["c"], "type": "function", "function": {"name": "Bash", "arguments": "[1, 2]"}},
        ],
    }
    assert [a.kind for a in actions_of(message)] == [OTHER, OTHER, OTHER]


def _mini_swe_agent_text_run() -> list[dict[str, Any]]:
    task = "Please fix the off-by-one error in counter.py so that tests pass."
    listing = "./counter.py\n./tests/test_counter.py\n" + "\n".join(
        f"./pkg/module_{i}.py" for i in range(300)
    )
    return [
        {"role": "system", "content": "You are a helpful assistant that can interact with a computer."},
        {"role": "user", "content": task},
        {"role": "assistant", "content": "THOUGHT: explore.\n\n```mswea_bash_command\nls -R\n```"},
        {"role": "user", "content": f"<returncode>0</returncode>\n<output>\n{listing}\n</output>"},
        {
            "role": "assistant",
            "content": "THOUGHT: fix it.\n\n```mswea_bash_command\nsed -i 's/n + 2/n + 1/' counter.py\n```",
        },
        {"role": "user", "content": "<returncode>0</returncode>\n<output>\n</output>"},
        {"role": "assistant", "content": "THOUGHT: test.\n\n```mswea_bash_command\npython -m pytest -q\n```"},
        {
            "role": "user",
            "content": "<returncode>1</returncode>\n<output>\nE   AssertionError: 3 != 2\n"
            "1 failed, 4 passed in 0.12s\n</output>",
        },
    ]


def test_ledger_of_a_text_action_agent_takes_the_task_not_an_observation() -> None:
    messages = _mini_swe_agent_text_run()
    # The summarized range starts after the task: its first user message is an observation.
    ledger = build_ledger(messages, 2, len(messages))
    assert ledger.goal == messages[1]["content"]
    assert "./counter.py" not in ledger.render()
    assert [c.command for c in ledger.commands] == [
        "ls -R",
        "sed -i 's/n + 2/n + 1/' counter.py",
        "python -m pytest -q",
    ]
    assert {f.path: f.edits for f in ledger.files} == {"counter.py": 1}
    assert "1 failed, 4 passed in 0.12s" in ledger.test_summaries


def test_ledger_of_claude_code_and_codex_calls() -> None:
    def call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            ],
        }

    def result(call_id: str, text: str) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": call_id, "content": text}

    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "Make main return 2."},
        call("1", "Read", {"file_path": "/w/src/app.py"}),
        result("1", "def main():\n    return 1"),
        call("2", "Edit", {"file_path": "/w/src/app.py", "old_string": "return 1", "new_string": "return 2"}),
        result("2", "The file /w/src/app.py has been updated."),
        call("3", "apply_patch", {"input": PATCH_TEXT}),
        result("3", "Success. Updated the following files:\nM src/app.py\nA tests/test_app.py"),
        call("4", "shell", {"command": ["bash", "-lc", "pytest -q"]}),
        result("4", "Exit code: 1\nOutput:\nFAILED tests/test_app.py::test_main\n1 failed in 0.01s"),
        call("5", "TodoWrite", {"todos": [{"content": "Make tests pass", "status": "in_progress"}]}),
        result("5", "ok"),
    ]
    ledger = build_ledger(messages)
    files = {f.path: (f.views, f.edits) for f in ledger.files}
    assert files["/w/src/app.py"] == (1, 1)
    assert files["src/app.py"] == (0, 1) and files["tests/test_app.py"] == (0, 1)
    assert [(c.command, c.exit_code) for c in ledger.commands] == [("pytest -q", 1)]
    assert ledger.open_items == ("Make tests pass",)
