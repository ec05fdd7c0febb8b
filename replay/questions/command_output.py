"""``command_output``: what the Nth execution of a command reported.

A test summary if one was printed, else the last output line of a ``python <script>`` run,
else of another command that runs a program. Input sent to a running process (``C-c``,
``is_input``) is not an execution, so it does not count towards N.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Sequence

from policies.actions import SHELL
from replay.questions.question import CONTENT, Question, evidence_line
from replay.questions.recording import INTERPRETER_SUFFIX, RecordedAction
from replay.recording.cases import Case

_MAX_COMMAND_CHARS = 300
_MIN_OUTPUT_CHARS = 8

_INPUT_COMMANDS = frozenset({"c-c", "c-d", "c-z", "c-\\", "ctrl+c", "ctrl-c", "ctrl+d", "ctrl-d", "^c", "^d"})
_COUNT = r"\d+ (?:passed|failed|errors?|skipped|xfailed|xpassed|warnings?|deselected|rerun)"
_PYTEST_SUMMARY = re.compile(rf"^[=\s]*((?:{_COUNT})(?:, {_COUNT})*(?: in [\d.]+s(?: \([^)]*\))?)?)[=\s]*$")
_COUNT_ITEM = re.compile(_COUNT)
_UNITTEST_RAN = re.compile(r"^Ran (\d+) tests? in [\d.]+s\s*$")
_UNITTEST_STATUS = re.compile(r"^(OK(?: \([^)]*\))?|FAILED \([^)]*\))")
# Lines the agent's shell or framework adds around a program's output.
_NOISE = re.compile(
    r"^(?:\(Open file: .*\)|\(Current directory: .*\)|bash-\$.*|\[Command finished with exit code -?\d+\]"
    r"|\[The command completed with exit code -?\d+\.?\]|\[Current working directory: .*\]"
    r"|\[Python [Ii]nterpreter: .*\]|\S+@\S+:.*[#$]\s*|OBSERVATION:|Observation:"
    r"|Your command ran successfully and did not produce any output\.?|\[Command timed out.*\]"
    r"|\[Command finished.*\]|\[Below is the output of the previous command\.\]"
    r"|The command .* was cancelled because it took more than .*|Command timed out.*)$"
)
_PYTHON_RUN = re.compile(r"^(?:cd \S+ *(?:&&|;) *)?(?:timeout \d+ )?python[\d.]* +(?:-u +)?[^\s-]\S*\.py\b")

# Programs whose output is a file, a listing or a search, not what a program reported.
_NOT_RUNS = frozenset(
    {
        "ls",
        "cat",
        "grep",
        "egrep",
        "rg",
        "find",
        "head",
        "tail",
        "sed",
        "awk",
        "wc",
        "tree",
        "pwd",
        "cd",
        "echo",
        "printf",
        "mkdir",
        "touch",
        "rm",
        "cp",
        "mv",
        "chmod",
        "which",
        "pip",
        "pip3",
        "open",
        "goto",
        "scroll_up",
        "scroll_down",
        "search_file",
        "search_dir",
        "find_file",
        "edit",
        "create",
        "insert",
        "append",
        "submit",
        "diff",
        "file",
        "stat",
        "du",
        "df",
        "env",
        "export",
        "source",
    }
)


def _ordinal(number: int) -> str:
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def _executions(actions: Sequence[RecordedAction]) -> Iterator[tuple[RecordedAction, str, int]]:
    """(action, normalized command, execution number) of every command run."""
    counts: Counter[str] = Counter()
    for action in actions:
        command = action.action.command
        if action.action.kind != SHELL or not isinstance(command, str):
            continue
        if str(action.args.get("is_input", "")).lower() == "true":
            continue
        normalized = " ".join(command.split())
        if not normalized or normalized.lower() in _INPUT_COMMANDS:
            continue
        counts[normalized] += 1
        yield action, normalized, counts[normalized]


def _clean_line(line: str) -> str:
    return INTERPRETER_SUFFIX.sub("", line).strip()


def _test_summary(output: str) -> tuple[str, tuple[str, ...], tuple[str, ...]] | None:
    """(reference, evidence, exact items) of the first test summary in an output."""
    lines = output.splitlines()
    for position, raw in enumerate(lines):
        line = _clean_line(raw)
        pytest = _PYTEST_SUMMARY.match(line)
        if pytest and re.search(r"\d+ (?:passed|failed|errors?)\b", pytest.group(1)):
            core = pytest.group(1).strip()
            return core, (core,), tuple(_COUNT_ITEM.findall(core))
        ran = _UNITTEST_RAN.match(line)
        if ran:
            for later in lines[position + 1 : position + 6]:
                status = _UNITTEST_STATUS.match(_clean_line(later))
                if status:
                    ran_line = line.strip()
                    items = (f"Ran {ran.group(1)} test", status.group(1))
                    return f"{ran_line}\n{status.group(1)}", (ran_line, status.group(1)), items
            return None
    return None


def _last_output_line(output: str, normalized: str) -> str | None:
    for raw in reversed(output.splitlines()):
        line = _clean_line(raw)
        if not line or _NOISE.match(line) or " ".join(line.split()) == normalized:
            continue
        return line
    return None


def command_output_question(
    case: Case,
    actions: Sequence[RecordedAction],
    texts: Sequence[tuple[int, str, str]],
    error_line: str | None,
) -> Question | str:
    """The first execution whose output holds a test summary; else the first ``python <script>``
    run, else the first other command (not a viewer, search or file operation), with a
    distinctive last output line, preferring a line other than the ``error`` question's and one
    not seen earlier in the history (in the task, say). Or why the question is omitted."""
    executions = [
        (action, command, number)
        for action, command, number in _executions(actions)
        if action.result and len(command) <= _MAX_COMMAND_CHARS
    ]
    for action, command, number in executions:
        summary = _test_summary(action.result)
        if summary:
            reference, evidence, items = summary
            return _command_question(case, action, command, number, reference, evidence, items, True)
    tiers: list[list[tuple[RecordedAction, str, int, str]]] = [[], []]
    for action, command, number in executions:
        python = bool(_PYTHON_RUN.match(command))
        if not python and _not_a_run(command):
            continue
        line = _last_output_line(action.result, command)
        if line is None or len(line) < _MIN_OUTPUT_CHARS:
            continue
        tiers[0 if python else 1].append((action, command, number, line))
    for tier in tiers:
        if not tier:
            continue

        def rank(item: tuple[RecordedAction, str, int, str]) -> tuple[bool, bool]:
            action, _command, _number, line = item
            seen = any(line in text for index, _where, text in texts if index < action.index)
            return (error_line is not None and error_line in line, seen)

        action, command, number, line = min(tier, key=rank)
        quoted = evidence_line(line)
        return _command_question(case, action, command, number, quoted, (quoted,), (quoted,), False)
    if not executions:
        return "no command with recorded output"
    return "no test summary or command run with a distinctive last output line"


def _not_a_run(command: str) -> bool:
    """Commands whose output is a file, a listing or a search, not what a program reported."""
    words = re.sub(r"^cd \S+ *(?:&&|;) *", "", command).split()
    if not words:
        return True
    program = words[0]
    return (
        program in _NOT_RUNS
        or "\n" in command.strip()
        or (program == "git" and len(words) > 1 and words[1] in ("diff", "status", "log", "show", "grep"))
        or (program.startswith("python") and len(words) > 1 and words[1] == "-c")
    )


def _command_question(
    case: Case,
    action: RecordedAction,
    command: str,
    number: int,
    reference: str,
    evidence: tuple[str, ...],
    items: tuple[str, ...],
    is_test: bool,
) -> Question:
    form = (
        "Quote its test summary exactly (the counts, e.g. `3 passed, 1 failed in 0.52s`, or "
        "`Ran 5 tests` with `OK` / `FAILED (failures=1)`)."
        if is_test
        else "Quote the last line of its output exactly."
    )
    source = action.result_index if action.result_index is not None else action.index
    return Question(
        question_id=f"{case.case_id}:command_output",
        kind="command_output",
        prompt=f"What did the {_ordinal(number)} time you ran `{command}` report? {form}",
        reference=reference,
        evidence=evidence,
        exact_items=items,
        source_messages=(source,),
        evidence_in=tuple(CONTENT for _ in evidence),
    )
