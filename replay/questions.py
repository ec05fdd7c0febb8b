"""Questions with programmatic reference answers, by the rules of the design's section 4.4.

Every reference is copied from the recorded run or its final patch; no model writes one. A
question lists the *evidence* its answer depends on: verbatim substrings of the history (of a
message's content, or of a native tool call's parsed argument values) that an answerer must
see. The harness checks each one against a compacted view: visible, recoverable from an
offloaded output, or lost.

Four kinds:

- ``files_changed``: the repository-relative paths the final patch changes.
- ``first_edit``: the code of the first edit applied inside the task repository (a failed
  edit, or one outside the repository, does not count; if the first one was made by a shell
  command, the question is omitted rather than replaced by a later edit).
- ``command_output``: what the Nth execution of a command reported (a test summary, else the
  last output line of a ``python <script>`` run). Input sent to a running process is not an
  execution.
- ``error``: the first exception line seen in a tool output or observation.

Pure and deterministic: no I/O.
"""

from __future__ import annotations

import posixpath
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from policies.actions import EDIT, PATCH, SHELL, WRITE, Action, actions_of
from policies.conversation import message_text, role, tool_call_ids
from policies.shell_commands import shell_write_targets
from replay.cases import Case

KINDS = ("files_changed", "first_edit", "command_output", "error")

# Where an evidence string sits: a message's content (tool result, observation, assistant
# text with text actions) or the parsed argument values of a native tool call.
CONTENT = "content"
ARGUMENTS = "arguments"

_MAX_EVIDENCE_LINES = 5
_MIN_LINE_CHARS = 6
_MAX_LINE_CHARS = 200
_LONG_LINE_PREFIX = 120
_MAX_COMMAND_CHARS = 300
_MIN_OUTPUT_CHARS = 8


@dataclass(frozen=True, slots=True)
class Question:
    question_id: str  # f"{case_id}:{kind}" (unique per case)
    kind: str  # files_changed | first_edit | command_output | error
    prompt: str  # the user message appended to the final history
    reference: str  # the reference answer (human-readable)
    evidence: tuple[str, ...]  # verbatim strings the answer depends on
    exact_items: tuple[str, ...]  # what a deterministic checker can look for in an answer
    source_messages: tuple[int, ...]  # indices of the case messages the evidence comes from
    # Per evidence string: CONTENT (a message's content) or ARGUMENTS (parsed values of a
    # native tool call's arguments).
    evidence_in: tuple[str, ...] = ()


# --- the history as text -------------------------------------------------------------------


def strings_in(value: Any) -> Iterator[str]:
    """Every string inside a JSON value (tool-call arguments), depth first."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings_in(item)


def history_texts(case: Case) -> list[tuple[int, str, str]]:
    """(message index, CONTENT or ARGUMENTS, text) for every searchable text of the history:
    each message's content, and each string value of a native tool call's parsed arguments."""
    texts: list[tuple[int, str, str]] = []
    for index, message in enumerate(case.messages):
        text = message_text(message)
        if text:
            texts.append((index, CONTENT, text))
        if tool_call_ids(message) or isinstance(message.get("tool_calls"), list):
            for action in actions_of(message):
                texts.extend((index, ARGUMENTS, value) for value in strings_in(action.args) if value)
    return texts


def _locate(texts: Sequence[tuple[int, str, str]], needle: str) -> tuple[int, str] | None:
    for index, where, text in texts:
        if needle in text:
            return index, where
    return None


def _locate_path(
    texts: Sequence[tuple[int, str, str]], path: str, root: str | None
) -> tuple[int, str] | None:
    """Like ``_locate``, for a repository-relative path: not part of a longer name, and after a
    slash only when that slash ends the repository root (or the root is unknown)."""
    before = [r"(?<![\w./-])", r"(?<=[\s'\"`(=]\./)"]
    before.append(rf"(?<={re.escape(root.rstrip('/'))}/)" if root else r"(?<=/)")
    pattern = re.compile(rf"(?:{'|'.join(before)}){re.escape(path)}(?![\w-])")
    for index, where, text in texts:
        if path in text and pattern.search(text):
            return index, where
    return None


# --- actions and their results -------------------------------------------------------------

_SHELL_TOOLS = frozenset(
    {"bash", "execute_bash", "terminal", "shell", "run", "execute_command", "run_command"}
)
_INPUT_COMMANDS = frozenset({"c-c", "c-d", "c-z", "c-\\", "ctrl+c", "ctrl-c", "ctrl+d", "ctrl-d", "^c", "^d"})


@dataclass(frozen=True, slots=True)
class _Action:
    index: int  # the assistant message
    action: Action
    native: bool
    result: str  # text of its result or observation, "" if none
    result_index: int | None

    @property
    def args(self) -> dict[str, Any]:
        return self.action.args


def _actions(case: Case) -> list[_Action]:
    messages = case.messages
    found: list[_Action] = []
    for index, message in enumerate(messages):
        if role(message) != "assistant":
            continue
        actions = actions_of(message)
        if not actions:
            continue
        ids = tool_call_ids(message)
        if ids:
            # Results follow their calls; match them in order (ids may repeat across a run).
            block: list[int] = []
            end = index + 1
            while end < len(messages) and role(messages[end]) == "tool":
                block.append(end)
                end += 1
            used: set[int] = set()
            for position, action in enumerate(actions):
                call_id = ids[position] if position < len(ids) else None
                result_index = next(
                    (i for i in block if i not in used and messages[i].get("tool_call_id") == call_id), None
                )
                if result_index is not None:
                    used.add(result_index)
                result = message_text(messages[result_index]) if result_index is not None else ""
                found.append(_Action(index, action, True, result, result_index))
        else:
            following = index + 1
            observed = following < len(messages) and role(messages[following]) == "user"
            result_index = following if observed else None
            result = message_text(messages[following]) if observed else ""
            found.extend(_Action(index, action, False, result, result_index) for action in actions)
    return found


def _observations(case: Case) -> Iterator[tuple[int, str]]:
    """(index, text) of every tool result and text-action observation, in order."""
    messages = case.messages
    for index, message in enumerate(messages):
        kind = role(message)
        if kind == "tool" or (
            kind == "user"
            and index > 0
            and role(messages[index - 1]) == "assistant"
            and not tool_call_ids(messages[index - 1])
            and actions_of(messages[index - 1])
        ):
            yield index, message_text(message)


def _ordinal(number: int) -> str:
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def _short(line: str) -> str:
    """A line as evidence: whole, or a distinctive prefix if very long."""
    line = line.strip()
    return line if len(line) <= _MAX_LINE_CHARS else line[:_LONG_LINE_PREFIX].rstrip()


# --- files_changed -------------------------------------------------------------------------

_DIFF_GIT = re.compile(r'^diff --git ("?a/.+?"?) ("?b/.+?"?)\s*$', re.MULTILINE)
_DIFF_FILE = re.compile(r"^(?:---|\+\+\+) (\S+)", re.MULTILINE)
_RENAME = re.compile(r"^rename (?:from|to) (.+)$", re.MULTILINE)


def _patch_path(raw: str) -> str | None:
    raw = raw.strip().strip('"')
    if raw == "/dev/null":
        return None
    if raw.startswith(("a/", "b/")):
        raw = raw[2:]
    return raw or None


def patch_paths(patch: str) -> list[str]:
    """Repository-relative paths a unified diff changes, in order (renames: both names)."""
    paths: list[str] = []
    for match in _DIFF_GIT.finditer(patch):
        paths.extend(p for p in (_patch_path(match.group(1)), _patch_path(match.group(2))) if p)
    paths.extend(m.strip() for m in _RENAME.findall(patch))
    if not paths:
        paths.extend(p for p in (_patch_path(m) for m in _DIFF_FILE.findall(patch)) if p)
    return list(dict.fromkeys(paths))


def _files_changed(case: Case, texts: Sequence[tuple[int, str, str]]) -> Question | str:
    patch = case.model_patch
    if not patch or not patch.strip():
        return "no final patch"
    paths = patch_paths(patch)
    if not paths:
        return "final patch changes no file"
    root = repo_root(case)
    evidence: list[str] = []
    where: list[str] = []
    sources: list[int] = []
    for path in paths:
        found = _locate_path(texts, path, root)
        if found:
            evidence.append(path)
            sources.append(found[0])
            where.append(found[1])
    if not evidence:
        return "no changed path appears in the history"
    return Question(
        question_id=f"{case.case_id}:files_changed",
        kind="files_changed",
        prompt=(
            "Which files does your final change modify? List every file your final patch changes "
            "(added, modified, renamed or deleted), one repository-relative path per line, and nothing else."
        ),
        reference="\n".join(paths),
        evidence=tuple(evidence),
        exact_items=tuple(paths),
        source_messages=tuple(sorted(set(sources))),
        evidence_in=tuple(where),
    )


# --- first_edit ----------------------------------------------------------------------------

_UPLOADED = re.compile(r"<uploaded_files>\s*(\S+?)\s*</uploaded_files>")
_CURRENT_DIRECTORY = re.compile(r"\(Current directory: (/[^)\s]*)\)")
_WORKING_DIRECTORY = re.compile(r"\[Current working directory: (/[^\]\s]*)\]")
_OPEN_FILE = re.compile(r"\(Open file: (/[^)\s]*)\)")
_FILE_HEADER = re.compile(r"\[File: (\S+) \(\d+ lines total\)\]")
_TEXT_EDIT = re.compile(
    r"^(edit|insert|append)\b[^\n]*\n(.*?)\n?end_of_(?:edit|insert|append)\s*$", re.DOTALL
)
_EDIT_FAILURES = (
    "No replacement was performed",
    "ERROR:",
    "Ran into [Errno",
    "did not appear verbatim",
    "Your proposed edit has introduced new syntax error",
    "Parameter `",
    "Invalid `",
    "File already exists",
    "Traceback (most recent call last)",
    "No file open",
    "Usage: ",
    "is not a valid",
    "No such file or directory",
    "command not found",
)
# Paths outside any repository when its root is unknown (never written to: only compared).
_EDIT_SUCCESSES = (
    "has been edited",
    "File created successfully",
    "File updated",
    "Text replaced",
    "Replaced ",
    "[File: ",
)
_TEMP_DIRS = ("/tmp", "/var/tmp", "/dev", "/proc")  # noqa: S108
_TRIVIAL_LINES = frozenset({"pass", "else:", "try:", "return", "continue", "break", '"""', "'''", "finally:"})


def repo_root(case: Case) -> str | None:
    """The task repository's root: the uploaded directory of the task, else the first
    working directory an observation reports."""
    for message in case.messages:
        if role(message) == "user":
            match = _UPLOADED.search(message_text(message))
            if match:
                return posixpath.normpath(match.group(1))
    for _index, text in _observations(case):
        match = _CURRENT_DIRECTORY.search(text) or _WORKING_DIRECTORY.search(text)
        if match:
            return posixpath.normpath(match.group(1))
    return None


def _inside(path: str | None, root: str | None) -> bool:
    """Whether ``path`` lies in the repository; relative paths are taken from its root."""
    if path is None:
        return True
    path = path.strip().strip("'\"")
    if not path.startswith("/"):
        return not posixpath.normpath(path).startswith("..")
    path = posixpath.normpath(path)
    if root is None:
        return not any(path == d or path.startswith(d + "/") for d in _TEMP_DIRS)
    return path == root or path.startswith(root.rstrip("/") + "/")


@dataclass(frozen=True, slots=True)
class _Edit:
    path: str | None
    code: str | None  # None: made by a shell command, not quotable
    old: str = ""
    # Files a shell edit writes (None: unknown, taken as the repository).
    targets: tuple[str | None, ...] = ()


_LEADING_CD = re.compile(r"cd\s+(\S+)\s*(?:&&|;)")


def _edit_of(item: _Action, open_file: str | None) -> _Edit | None:
    """The edit an action makes, if it is one (read through the shared action vocabulary)."""
    action = item.action
    header = _FILE_HEADER.search(item.result[:600])
    shown = header.group(1) if header else None
    current = shown if shown and shown.startswith("/") else open_file or shown
    if action.kind in (EDIT, WRITE):
        if action.code is None:
            return None
        # SWE-agent's edits of the open file name no path.
        path = action.path if action.path is not None or action.kind == WRITE else current
        return _Edit(path, action.code, action.old or "")
    if action.kind == PATCH:
        paths = action.paths or ((action.path,) if action.path else ())
        if len(paths) == 1 and action.code:
            return _Edit(paths[0], action.code)
        return _Edit(None, None, targets=paths or (None,))
    if action.kind == SHELL and action.command:
        command = action.command
        targets = shell_write_targets(command)
        if targets:
            cd = _LEADING_CD.match(command.strip())
            base = cd.group(1).strip("'\"") if cd else None
            resolved = tuple(
                posixpath.join(base, t) if t and base and not t.startswith("/") else t for t in targets
            )
            return _Edit(None, None, targets=resolved)
    return None


def _failed(result: str) -> bool:
    """Whether an edit's result reports failure (no result: not known to be applied)."""
    head = _OBSERVATION_PREFIX.sub("", result.strip(), count=1).strip()[:400]
    if not head:
        return True
    first_line = head.splitlines()[0]
    if any(marker in first_line for marker in _EDIT_SUCCESSES):
        return False
    return any(marker in head for marker in _EDIT_FAILURES)


def _evidence_lines(code: str, old: str, earlier: str) -> list[str]:
    """Up to five distinctive lines of ``code``: new ones (not in the replaced text, not seen
    earlier in the history) first, short before very long, then in order of appearance."""
    lines = [line.strip() for line in code.splitlines()]
    candidates = [
        (position, line)
        for position, line in enumerate(lines)
        if len(line) >= _MIN_LINE_CHARS and line not in _TRIVIAL_LINES
    ]
    if not candidates:
        whole = code.strip()
        if whole and "\n" not in whole:
            return [whole]
        non_blank = [line for line in lines if line]
        return non_blank[:1]
    old_lines = {line.strip() for line in old.splitlines()}
    unique = list(dict.fromkeys(line for _p, line in candidates))
    ranked = sorted(
        enumerate(unique),
        key=lambda item: (
            item[1] in old_lines,
            item[1] in earlier,
            len(item[1]) > _LONG_LINE_PREFIX,
            item[0],
        ),
    )
    chosen = sorted(ranked[:_MAX_EVIDENCE_LINES])
    return [_short(line) for _position, line in chosen]


def _relative(path: str, root: str | None) -> str:
    if root and path.startswith(root.rstrip("/") + "/"):
        return path[len(root.rstrip("/")) + 1 :]
    return path


def _first_edit(
    case: Case, actions: Sequence[_Action], texts: Sequence[tuple[int, str, str]]
) -> Question | str:
    root = repo_root(case)
    open_file: str | None = None
    for action in actions:
        edit = _edit_of(action, open_file)
        opened = _OPEN_FILE.findall(action.result)
        if opened:
            open_file = opened[-1]
        if edit is None:
            continue
        if edit.code is None:
            if any(_inside(target, root) for target in edit.targets):
                return "first edit not quotable"
            continue
        path = edit.path
        if path and not path.startswith("/") and root:
            path = posixpath.join(root, path)
        if not _inside(path, root):
            continue
        if _failed(action.result):
            continue
        code = edit.code
        earlier = "\n".join(text for index, _where, text in texts if index < action.index)
        evidence = _evidence_lines(code, edit.old, earlier)
        if not evidence:
            return "first edit not quotable"
        shown_path = path or "(the open file)"
        relative = _relative(shown_path, root)
        return Question(
            question_id=f"{case.case_id}:first_edit",
            kind="first_edit",
            prompt=(
                "What exact code did your first successful edit inside the repository write? Give the "
                "file path on the first line, then the new code (the replacement or inserted text, or the "
                "content of the created file) exactly as you wrote it."
            ),
            reference=f"{shown_path}\n{code}",
            evidence=tuple(evidence),
            exact_items=(relative, *evidence) if path else tuple(evidence),
            source_messages=(action.index,),
            evidence_in=tuple(ARGUMENTS if action.native else CONTENT for _ in evidence),
        )
    return "no applied edit inside the repository"


# --- command_output ------------------------------------------------------------------------

_COUNT = r"\d+ (?:passed|failed|errors?|skipped|xfailed|xpassed|warnings?|deselected|rerun)"
_PYTEST_SUMMARY = re.compile(rf"^[=\s]*((?:{_COUNT})(?:, {_COUNT})*(?: in [\d.]+s(?: \([^)]*\))?)?)[=\s]*$")
_COUNT_ITEM = re.compile(_COUNT)
_UNITTEST_RAN = re.compile(r"^Ran (\d+) tests? in [\d.]+s\s*$")
_UNITTEST_STATUS = re.compile(r"^(OK(?: \([^)]*\))?|FAILED \([^)]*\))")
_INTERPRETER_SUFFIX = re.compile(r"\[Python [Ii]nterpreter: [^\]]*\]")
_NOISE = re.compile(
    r"^(?:\(Open file: .*\)|\(Current directory: .*\)|bash-\$.*|\[Command finished with exit code -?\d+\]"
    r"|\[The command completed with exit code -?\d+\.?\]|\[Current working directory: .*\]"
    r"|\[Python [Ii]nterpreter: .*\]|\S+@\S+:.*[#$]\s*|OBSERVATION:|Observation:"
    r"|Your command ran successfully and did not produce any output\.?|\[Command timed out.*\]"
    r"|\[Command finished.*\]|\[Below is the output of the previous command\.\]"
    r"|The command .* was cancelled because it took more than .*|Command timed out.*)$"
)
_PYTHON_RUN = re.compile(r"^(?:cd \S+ *(?:&&|;) *)?(?:timeout \d+ )?python[\d.]* +(?:-u +)?[^\s-]\S*\.py\b")


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


def _executions(actions: Sequence[_Action]) -> Iterator[tuple[_Action, str, int]]:
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
    return _INTERPRETER_SUFFIX.sub("", line).strip()


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


def _command_output(
    case: Case,
    actions: Sequence[_Action],
    texts: Sequence[tuple[int, str, str]],
    error_line: str | None,
) -> Question | str:
    """The first execution whose output holds a test summary; else the first ``python <script>``
    run, else the first other command (not a viewer, search or file operation), with a
    distinctive last output line, preferring a line other than the ``error`` question's and one
    not seen earlier in the history (in the task, say)."""
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
    tiers: list[list[tuple[_Action, str, int, str]]] = [[], []]
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

        def rank(item: tuple[_Action, str, int, str]) -> tuple[bool, bool]:
            action, _command, _number, line = item
            seen = any(line in text for index, _where, text in texts if index < action.index)
            return (error_line is not None and error_line in line, seen)

        action, command, number, line = min(tier, key=rank)
        quoted = _short(line)
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
    action: _Action,
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


# --- error ---------------------------------------------------------------------------------

# An exception line: at the start of a line (pytest's "E   " allowed) or after one short label
# a script printed ("Error: ValueError: ..."); indented lines (docstrings, code) do not count.
_EXCEPTION_LINE = re.compile(
    r"^(?:E {2,}|[A-Za-z][\w ]{0,30}: )?((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)): \S.*$"
)
_OBSERVATION_PREFIX = re.compile(r"^(?:OBSERVATION:\s*\n|Observation: )")


def _error(case: Case) -> Question | str:
    for index, text in _observations(case):
        text = _OBSERVATION_PREFIX.sub("", text, count=1)
        for raw in text.splitlines():
            # Indentation kept: an indented line is code or a docstring, not a raised exception.
            line = _INTERPRETER_SUFFIX.sub("", raw).rstrip()
            match = _EXCEPTION_LINE.match(line)
            if not match:
                continue
            if re.match(r"E {2,}", line):
                line = line[1:].strip()
            evidence = _short(line)
            return Question(
                question_id=f"{case.case_id}:error",
                kind="error",
                prompt=(
                    "What was the first exception you saw in the output of a command or tool during this "
                    "work? Quote that exception line exactly (the form `SomeError: message`)."
                ),
                reference=evidence,
                evidence=(evidence,),
                exact_items=(match.group(1), evidence),
                source_messages=(index,),
                evidence_in=(CONTENT,),
            )
    return "no exception line in any tool output"


# --- all -----------------------------------------------------------------------------------


def build_questions(case: Case, kinds: Sequence[str] = KINDS) -> tuple[list[Question], dict[str, str]]:
    """Questions for one case, and for each kind omitted the reason (for the report)."""
    unknown = [kind for kind in kinds if kind not in KINDS]
    if unknown:
        raise ValueError(f"unknown question kinds: {unknown}")
    texts = history_texts(case)
    actions = _actions(case)
    questions: list[Question] = []
    omitted: dict[str, str] = {}
    error = _error(case)
    error_line = None if isinstance(error, str) else error.reference
    for kind in KINDS:
        if kind not in kinds:
            continue
        built: Question | str
        if kind == "files_changed":
            built = _files_changed(case, texts)
        elif kind == "first_edit":
            built = _first_edit(case, actions, texts)
        elif kind == "command_output":
            built = _command_output(case, actions, texts, error_line)
        else:
            built = error
        if isinstance(built, str):
            omitted[kind] = built
        else:
            questions.append(built)
    return questions, omitted
