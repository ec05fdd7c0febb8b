"""``command_output`` (replay/questions/command_output.py): what the Nth execution of a command
reported, a test summary or a program's last output line."""

from __future__ import annotations

from tests.replay.question_runs import (
    assert_evidence_in_history,
    call,
    native_run,
    omission,
    question,
    swe_agent_run,
)

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
