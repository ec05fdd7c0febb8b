"""``first_edit`` (replay/questions/first_edit.py): the code of the first edit applied inside the
repository, in native tool calls, SWE-agent edit blocks and SWE-smith function text."""

from __future__ import annotations

import pytest

from replay.questions import ARGUMENTS, CONTENT
from tests.replay.question_runs import (
    assert_evidence_in_history,
    assistant,
    call,
    make_case,
    msg,
    native_run,
    omission,
    question,
    result,
    swe_agent_run,
)

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
