"""``error`` (replay/questions/error.py): the first exception line a command or tool reported."""

from __future__ import annotations

from tests.replay.question_runs import TASK, assert_evidence_in_history, call, native_run, omission, question


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
