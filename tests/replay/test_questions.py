"""Questions with programmatic references (replay/questions.py): every rule of section 4.4 on
small hand-written runs, and a sweep over the sample trajectories checking that each evidence
string is verbatim in the recorded history."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from replay.cases import Case, build_case
from replay.questions import ARGUMENTS, CONTENT, KINDS, build_questions, history_texts, patch_paths
from replay.rows import iter_rows

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = Path("/work/shared/data/trajectories.jsonl")
FIXTURE = ROOT / "tests" / "fixtures" / "trajectories_sample.jsonl"

TASK = "<uploaded_files>\n/workspace/proj\n</uploaded_files>\nFix the bug in pkg/mod.py."


def msg(role: str, content: Any = None, **extra: Any) -> dict[str, Any]:
    message = {"role": role, "content": content, "name": None, "tool_call_id": None, "tool_calls": None}
    message.update(extra)
    return message


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def assistant(*calls: dict[str, Any], text: str = "") -> dict[str, Any]:
    return msg("assistant", text, tool_calls=list(calls) or None)


def result(call_id: str, name: str, content: str) -> dict[str, Any]:
    return msg("tool", content, name=name, tool_call_id=call_id)


def make_case(messages: list[dict[str, Any]], patch: str | None = None) -> Case:
    row = {
        "instance_id": "owner__proj-1",
        "repo": "owner/proj",
        "source": "test",
        "trajectory": [msg("system", "You are an agent."), *messages],
        "model_patch": patch,
        "tools": [],
    }
    case = build_case(row, 0)
    assert isinstance(case, Case), case
    return case


def native_run(*steps: tuple[dict[str, Any], str], task: str = TASK, patch: str | None = None) -> Case:
    """A native tool-call run: each step is (call, its result text)."""
    messages = [msg("user", task)]
    for number, (tool_call, output) in enumerate(steps):
        tool_call = {**tool_call, "id": f"call_{number}"}
        messages.append(assistant(tool_call))
        messages.append(result(f"call_{number}", tool_call["function"]["name"], output))
    messages.append(msg("assistant", "Done."))
    return make_case(messages, patch)


def question(case: Case, kind: str) -> Any:
    questions, omitted = build_questions(case, (kind,))
    assert not omitted, omitted
    (built,) = questions
    assert built.kind == kind
    assert built.question_id == f"{case.case_id}:{kind}"
    return built


def omission(case: Case, kind: str) -> str:
    questions, omitted = build_questions(case, (kind,))
    assert not questions
    return omitted[kind]


def assert_evidence_in_history(case: Case, built: Any) -> None:
    texts = history_texts(case)
    assert len(built.evidence_in) == len(built.evidence)
    for evidence, where in zip(built.evidence, built.evidence_in, strict=True):
        assert any(evidence in text for _i, w, text in texts if w == where), (evidence, where)


# --- files_changed -------------------------------------------------------------------------

PATCH = """diff --git a/pkg/mod.py b/pkg/mod.py
index 1..2 100644
--- a/pkg/mod.py
+++ b/pkg/mod.py
@@ -1 +1 @@
-x = 1
+x = 2
diff --git a/old_name.py b/pkg/new_name.py
similarity index 90%
rename from old_name.py
rename to pkg/new_name.py
diff --git a/tests/test_new.py b/tests/test_new.py
new file mode 100644
--- /dev/null
+++ b/tests/test_new.py
@@ -0,0 +1 @@
+def test(): pass
diff --git a/gone.py b/gone.py
deleted file mode 100644
--- a/gone.py
+++ /dev/null
"""


def test_patch_paths_cover_modified_renamed_new_and_deleted_files() -> None:
    assert patch_paths(PATCH) == [
        "pkg/mod.py",
        "old_name.py",
        "pkg/new_name.py",
        "tests/test_new.py",
        "gone.py",
    ]
    # Without git headers, the ---/+++ lines name the files.
    assert patch_paths("--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n") == ["x.py"]


def test_files_changed_evidence_only_paths_the_history_shows() -> None:
    case = native_run(
        (call("", "str_replace_editor", command="view", path="/workspace/proj/pkg/mod.py"), "x = 1"),
        (call("", "execute_bash", command="git mv old_name.py pkg/new_name.py && rm gone.py"), ""),
        patch=PATCH,
    )
    built = question(case, "files_changed")
    assert built.reference.splitlines() == patch_paths(PATCH)
    assert built.exact_items == tuple(patch_paths(PATCH))
    # tests/test_new.py never appears in the history; "pkg/mod.py" appears in the task first.
    assert built.evidence == ("pkg/mod.py", "old_name.py", "pkg/new_name.py", "gone.py")
    assert built.evidence_in == (CONTENT, ARGUMENTS, ARGUMENTS, ARGUMENTS)
    assert built.source_messages == (1, 4)
    assert_evidence_in_history(case, built)


def test_files_changed_omitted_without_patch_or_visible_path() -> None:
    run = (call("", "execute_bash", command="ls"), "setup.py")
    assert omission(native_run(run), "files_changed") == "no final patch"
    assert omission(native_run(run, patch="  \n"), "files_changed") == "no final patch"
    assert omission(native_run(run, patch="not a diff"), "files_changed") == "final patch changes no file"
    other = "diff --git a/elsewhere/z.py b/elsewhere/z.py\n--- a/elsewhere/z.py\n+++ b/elsewhere/z.py\n"
    assert omission(native_run(run, patch=other), "files_changed") == "no changed path appears in the history"


def test_files_changed_path_must_not_be_part_of_a_longer_name() -> None:
    patch = "diff --git a/mod.py b/mod.py\n--- a/mod.py\n+++ b/mod.py\n"
    case = native_run((call("", "execute_bash", command="cat pkg/other_mod.py"), "print(1)"), patch=patch)
    assert omission(case, "files_changed") == "no changed path appears in the history"


# --- first_edit ----------------------------------------------------------------------------

NEW_CODE = "def parse(value):\n    if value is None:\n        return DEFAULT\n    return int(value)\n"


def test_first_edit_skips_failed_edits_and_edits_outside_the_repository() -> None:
    case = native_run(
        (
            call(
                "",
                "str_replace_editor",
                command="str_replace",
                path="/workspace/proj/pkg/mod.py",
                old_str="nope",
            ),
            "ERROR:\nNo replacement was performed, old_str `nope` did not appear verbatim.",
        ),
        (
            call(
                "", "str_replace_editor", command="create", path="/tmp/scratch.py", file_text="print('tmp')"
            ),
            "File created successfully at: /tmp/scratch.py",
        ),
        (call("", "execute_bash", command="cat > /tmp/notes.txt <<'EOF'\nnotes\nEOF"), ""),
        (
            call(
                "",
                "str_replace_editor",
                command="str_replace",
                path="/workspace/proj/pkg/mod.py",
                old_str="def parse(value):\n    return int(value)\n",
                new_str=NEW_CODE,
            ),
            "The file /workspace/proj/pkg/mod.py has been edited.",
        ),
        (
            call(
                "", "str_replace_editor", command="insert", path="/workspace/proj/pkg/mod.py", new_str="X = 1"
            ),
            "The file /workspace/proj/pkg/mod.py has been edited.",
        ),
    )
    built = question(case, "first_edit")
    assert built.reference == f"/workspace/proj/pkg/mod.py\n{NEW_CODE}"
    assert built.evidence == ("def parse(value):", "if value is None:", "return DEFAULT", "return int(value)")
    assert built.exact_items == ("pkg/mod.py", *built.evidence)
    assert built.evidence_in == (ARGUMENTS,) * 4
    assert built.source_messages == (8,)
    assert_evidence_in_history(case, built)


def test_first_edit_evidence_is_at_most_five_lines_and_a_short_single_line_whole() -> None:
    code = "\n".join(f"value_{n} = compute({n})" for n in range(9))
    case = native_run(
        (
            call("", "str_replace_editor", command="create", path="/workspace/proj/gen.py", file_text=code),
            "File created successfully at: /workspace/proj/gen.py",
        )
    )
    assert len(question(case, "first_edit").evidence) == 5
    # Lines the replaced text already had, or seen earlier in the history, come last.
    old = "value_0 = compute(0)\nvalue_1 = compute(1)"
    case = native_run(
        (call("", "execute_bash", command="cat gen.py"), "value_2 = compute(2)"),
        (
            call(
                "",
                "str_replace_editor",
                command="str_replace",
                path="/workspace/proj/gen.py",
                old_str=old,
                new_str=code,
            ),
            "The file /workspace/proj/gen.py has been edited.",
        ),
    )
    assert question(case, "first_edit").evidence == tuple(
        f"value_{n} = compute({n})" for n in (3, 4, 5, 6, 7)
    )
    case = native_run(
        (
            call(
                "",
                "str_replace_editor",
                command="str_replace",
                path="/workspace/proj/a.py",
                old_str="b",
                new_str="c",
            ),
            "The file /workspace/proj/a.py has been edited.",
        )
    )
    assert question(case, "first_edit").evidence == ("c",)


@pytest.mark.parametrize(
    "command",
    [
        "sed -i 's/return int(value)/return int(value or 0)/' pkg/mod.py",
        "cd /workspace/proj && cat > pkg/mod.py << 'EOF'\nx = 1\nEOF",
        "echo 'x = 1' >> /workspace/proj/pkg/mod.py",
        "git apply fix.diff",
        "python -c \"open('pkg/mod.py', 'w').write('x = 1')\"",
    ],
)
def test_first_edit_made_by_a_shell_command_omits_the_question(command: str) -> None:
    case = native_run(
        (call("", "execute_bash", command="python -m pytest -q 2>&1 | tail -n 3 > /dev/null"), ""),
        (call("", "execute_bash", command=command), ""),
        (
            call(
                "",
                "str_replace_editor",
                command="str_replace",
                path="/workspace/proj/pkg/mod.py",
                old_str="a",
                new_str=NEW_CODE,
            ),
            "The file /workspace/proj/pkg/mod.py has been edited.",
        ),
    )
    assert omission(case, "first_edit") == "first edit not quotable"


@pytest.mark.parametrize(
    "command",
    [
        "python -m pytest -q 2>&1 | tail -n 3 > /dev/null",
        "cd /workspace/proj && diff -u <(cat a.py) <(cat b.py)",
        "echo 'x = 1' > /tmp/x.py && sed -i 's/1/2/' /tmp/x.py",
        'python -c "print(1 > 0)"',
        "grep -n 'a > b' pkg/mod.py",
    ],
)
def test_first_edit_ignores_shell_commands_that_write_no_repository_file(command: str) -> None:
    case = native_run(
        (call("", "execute_bash", command=command), ""),
        (
            call(
                "",
                "str_replace_editor",
                command="str_replace",
                path="/workspace/proj/pkg/mod.py",
                old_str="a",
                new_str=NEW_CODE,
            ),
            "OBSERVATION:\nThe file /workspace/proj/pkg/mod.py has been edited. Usage: ERROR: in the code",
        ),
    )
    assert question(case, "first_edit").source_messages == (4,)


def test_first_edit_omitted_when_no_edit_applied() -> None:
    case = native_run(
        (
            call(
                "", "str_replace_editor", command="create", path="/workspace/hello.py", file_text="print(1)"
            ),
            "Ran into [Errno 2] No such file or directory: '/workspace/hello.py'",
        ),
        (call("", "execute_bash", command="grep -rn 'x = 1' . > /dev/null; ls 2>&1"), "a.py"),
    )
    assert omission(case, "first_edit") == "no applied edit inside the repository"


def swe_agent_run(*steps: tuple[str, str]) -> Case:
    """SWE-agent: actions in ``` blocks, observations sent back as user messages."""
    messages = [msg("user", "ISSUE:\nparse() fails on None\n\nINSTRUCTIONS: ...")]
    for action, observation in steps:
        messages.append(msg("assistant", f"Let me act.\n```\n{action}\n```"))
        messages.append(
            msg(
                "user",
                f"{observation}\n\n(Open file: {_open_file(observation)})\n"
                "(Current directory: /proj)\nbash-$",
            )
        )
    messages.append(msg("assistant", "Done."))
    return make_case(messages)


def _open_file(observation: str) -> str:
    return "/proj/pkg/mod.py" if "mod.py" in observation else "n/a"


def test_first_edit_swe_agent_text_edit_block() -> None:
    case = swe_agent_run(
        ("create reproduce.py", "[File: /proj/reproduce.py (1 lines total)]\n1:"),
        ("open pkg/mod.py", "[File: /proj/pkg/mod.py (20 lines total)]\n1:def parse(value):"),
        (
            "edit 1:2\ndef parse(value):\nreturn int(value)\nend_of_edit",
            "Your proposed edit has introduced new syntax error(s). Please read this error message.\n"
            "[File: /proj/pkg/mod.py (20 lines total)]",
        ),
        (
            f"edit 1:2\n{NEW_CODE}end_of_edit",
            "[File: /proj/pkg/mod.py (22 lines total)]\n1:def parse(value):\nFile updated.",
        ),
    )
    built = question(case, "first_edit")
    assert built.reference == f"/proj/pkg/mod.py\n{NEW_CODE.rstrip()}"
    assert built.exact_items[0] == "pkg/mod.py"
    assert "if value is None:" in built.evidence
    assert built.evidence_in == (CONTENT,) * len(built.evidence)
    assert built.source_messages == (8,)
    assert_evidence_in_history(case, built)


def test_first_edit_swe_smith_function_text() -> None:
    action = (
        "I'll fix it.\n\n<function=str_replace_editor>\n<parameter=command>str_replace</parameter>\n"
        "<parameter=path>/testbed/pkg/mod.py</parameter>\n<parameter=old_str>\n    return int(value)\n"
        "</parameter>\n<parameter=new_str>\n    if value is None:\n        return DEFAULT_VALUE\n"
        "    return int(value)\n</parameter>\n</function>"
    )
    case = make_case(
        [
            msg("user", "<uploaded_files>\n/testbed\n</uploaded_files>\nFix parse()."),
            msg(
                "assistant",
                "<function=bash>\n<parameter=command>cat /testbed/pkg/mod.py</parameter>\n</function>",
            ),
            msg("user", "OBSERVATION:\ndef parse(value):\n    return int(value)"),
            msg("assistant", action),
            msg("user", "OBSERVATION:\nThe file /testbed/pkg/mod.py has been edited. Here's the result..."),
            msg("assistant", "Done."),
        ]
    )
    built = question(case, "first_edit")
    assert built.reference.startswith("/testbed/pkg/mod.py\n")
    assert built.evidence == ("if value is None:", "return DEFAULT_VALUE", "return int(value)")
    assert built.source_messages == (4,)
    assert_evidence_in_history(case, built)


def test_first_edit_native_swe_agent_edit_tool_uses_the_open_file() -> None:
    case = make_case(
        [
            msg("user", "ISSUE: missing colon"),
            assistant(call("c1", "create", filename="reproduce.py")),
            result(
                "c1",
                "create",
                "[File: reproduce.py (1 lines total)]\n1:\n(Open file: /repo/reproduce.py)\n"
                "(Current directory: /repo)\nbash-$",
            ),
            assistant(call("c2", "open", path="/repo/tests/missing_colon.py")),
            result(
                "c2",
                "open",
                "[File: /repo/tests/missing_colon.py (10 lines total)]\n"
                "(Open file: /repo/tests/missing_colon.py)\n(Current directory: /repo)\nbash-$",
            ),
            assistant(call("c3", "edit", search="def division(a, b)", replace="def division(a, b):")),
            result(
                "c3",
                "edit",
                "Replaced 1 occurrences. Please review.\n(Open file: /repo/tests/missing_colon.py)",
            ),
            msg("assistant", "Fixed."),
        ]
    )
    built = question(case, "first_edit")
    assert built.reference == "/repo/tests/missing_colon.py\ndef division(a, b):"
    assert built.evidence == ("def division(a, b):",)
    assert built.evidence_in == (ARGUMENTS,)
    assert_evidence_in_history(case, built)


# --- command_output ------------------------------------------------------------------------

PYTEST_FAIL = "collected 4 items\n\ntests/test_x.py ..F.\n\n========= 1 failed, 3 passed in 0.52s =========\n"


def test_command_output_numbers_executions_and_skips_input_to_a_running_process() -> None:
    case = native_run(
        (
            call("", "execute_bash", command="pytest tests/test_x.py"),
            "ERROR: file not found\n[Command finished with exit code 4]",
        ),
        (call("", "execute_bash", command="sleep 100"), "[Command timed out]"),
        (call("", "execute_bash", command="C-c", is_input="true"), "^C"),
        (call("", "execute_bash", command="", is_input="true"), ""),
        (
            call("", "execute_bash", command="pytest   tests/test_x.py", is_input="true"),
            "typed into a prompt",
        ),
        (call("", "execute_bash", command="C-c"), "^C"),
        (call("", "execute_bash", command="pytest  tests/test_x.py "), PYTEST_FAIL),
        (call("", "execute_bash", command="pytest tests/test_x.py"), "==== 4 passed in 0.40s ===="),
    )
    built = question(case, "command_output")
    assert "the 2nd time you ran `pytest tests/test_x.py`" in built.prompt
    assert built.reference == "1 failed, 3 passed in 0.52s"
    assert built.evidence == ("1 failed, 3 passed in 0.52s",)
    assert built.exact_items == ("1 failed", "3 passed")
    assert built.source_messages == (15,)
    assert_evidence_in_history(case, built)


def test_command_output_unittest_summary() -> None:
    output = (
        "..F\n======\nFAIL: test_b\n" + "-" * 70 + "\nRan 3 tests in 0.004s\r\n\r\n"
        "FAILED (failures=1)[Python Interpreter: /usr/bin/python]\n"
    )
    case = native_run((call("", "execute_bash", command="python -m unittest tests.test_x"), output))
    built = question(case, "command_output")
    assert "1st time you ran `python -m unittest tests.test_x`" in built.prompt
    assert built.reference == "Ran 3 tests in 0.004s\nFAILED (failures=1)"
    assert built.evidence == ("Ran 3 tests in 0.004s", "FAILED (failures=1)")
    assert built.exact_items == ("Ran 3 test", "FAILED (failures=1)")
    assert_evidence_in_history(case, built)


def test_command_output_python_script_last_line_without_shell_noise() -> None:
    noisy = (
        "OBSERVATION:\npython reproduce.py\nparsed: 41\nparsed: 42 (default used)\n"
        "[Python Interpreter: /opt/envs/testbed/bin/python]\nroot@openhands-workspace:/workspace/proj # \n"
        "[Command finished with exit code 0]"
    )
    case = native_run(
        (call("", "execute_bash", command="ls"), "reproduce.py\nsetup.py and other files"),
        (call("", "execute_bash", command="python reproduce.py"), "ok"),
        (call("", "execute_bash", command="python reproduce.py"), noisy),
    )
    built = question(case, "command_output")
    assert "the 2nd time you ran `python reproduce.py`" in built.prompt
    assert built.reference == "parsed: 42 (default used)"
    assert built.evidence == built.exact_items == ("parsed: 42 (default used)",)
    assert_evidence_in_history(case, built)


def test_command_output_swe_agent_observation() -> None:
    case = swe_agent_run(("python reproduce.py", "Traceback...\nResult is 17 instead of 42"))
    built = question(case, "command_output")
    assert built.reference == "Result is 17 instead of 42"
    assert built.source_messages == (3,)


def test_command_output_omitted_without_a_suitable_run() -> None:
    case = native_run(
        (call("", "execute_bash", command="python reproduce.py"), "42\n[Command finished with exit code 0]")
    )
    assert (
        omission(case, "command_output")
        == "no test summary or command run with a distinctive last output line"
    )
    case = native_run((call("", "str_replace_editor", command="view", path="/workspace/proj"), "files"))
    assert omission(case, "command_output") == "no command with recorded output"


# --- error ---------------------------------------------------------------------------------


def test_error_is_the_first_exception_line_of_a_tool_output() -> None:
    case = native_run(
        (
            call("", "execute_bash", command="cat pkg/mod.py"),
            'def parse(value):\n    """Raises:\n    ValueError: If bad."""',
        ),
        (call("", "execute_bash", command="grep -n Error pkg/mod.py"), "12:    raise ValueError(value)"),
        (
            call("", "execute_bash", command="python reproduce.py"),
            'Traceback (most recent call last):\n  File "reproduce.py", line 3, in <module>\n'
            "ValueError: invalid literal for int() with base 10: 'x'[Python Interpreter: /usr/bin/python]\n",
        ),
        (call("", "execute_bash", command="pytest"), "E       KeyError: 'missing'"),
        task=TASK + "\nIt raises ValueError: in the task text, which does not count.",
    )
    built = question(case, "error")
    assert built.reference == "ValueError: invalid literal for int() with base 10: 'x'"
    assert built.evidence == (built.reference,)
    assert built.exact_items == ("ValueError", built.reference)
    assert built.source_messages == (7,)
    assert_evidence_in_history(case, built)


def test_error_pytest_prefix_and_long_lines() -> None:
    long_message = "x" * 300
    case = native_run(
        (call("", "execute_bash", command="pytest"), f"E       pkg.errors.ParseError: {long_message}"),
    )
    built = question(case, "error")
    assert built.reference.startswith("pkg.errors.ParseError: xxx")
    assert 40 <= len(built.reference) <= 200
    assert built.exact_items[0] == "pkg.errors.ParseError"
    assert_evidence_in_history(case, built)


def test_error_omitted_when_no_exception_line() -> None:
    case = native_run((call("", "execute_bash", command="ls"), "a.py"), task=TASK + "\nKeyError: boom")
    assert omission(case, "error") == "no exception line in any tool output"


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
    # The project's fixture rows always exist; the full sample when it sits beside the project.
    return SAMPLE if SAMPLE.exists() else FIXTURE


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
