"""``first_edit``: the code of the first edit applied inside the task repository.

A failed edit, or one outside the repository, does not count. If the first edit inside the
repository was made by a shell command (``sed -i``, a heredoc, ``git apply``), its code cannot
be quoted, and the question is omitted rather than replaced by a later edit: a later edit
would not be the *first* one the answer must recall.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass

from policies.actions import EDIT, PATCH, SHELL, WRITE
from policies.shell_commands import shell_write_targets
from replay.questions.question import ARGUMENTS, CONTENT, LONG_LINE_PREFIX, Question, evidence_line
from replay.questions.recording import OBSERVATION_PREFIX, RecordedAction, repo_root
from replay.recording.cases import Case

_MAX_EVIDENCE_LINES = 5
_MIN_LINE_CHARS = 6

_OPEN_FILE = re.compile(r"\(Open file: (/[^)\s]*)\)")
_FILE_HEADER = re.compile(r"\[File: (\S+) \(\d+ lines total\)\]")
_LEADING_CD = re.compile(r"cd\s+(\S+)\s*(?:&&|;)")
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
_EDIT_SUCCESSES = (
    "has been edited",
    "File created successfully",
    "File updated",
    "Text replaced",
    "Replaced ",
    "[File: ",
)
# Paths outside any repository when its root is unknown (never written to: only compared).
_TEMP_DIRS = ("/tmp", "/var/tmp", "/dev", "/proc")  # noqa: S108
_TRIVIAL_LINES = frozenset({"pass", "else:", "try:", "return", "continue", "break", '"""', "'''", "finally:"})


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


def _edit_of(item: RecordedAction, open_file: str | None) -> _Edit | None:
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
    head = OBSERVATION_PREFIX.sub("", result.strip(), count=1).strip()[:400]
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
            len(item[1]) > LONG_LINE_PREFIX,
            item[0],
        ),
    )
    chosen = sorted(ranked[:_MAX_EVIDENCE_LINES])
    return [evidence_line(line) for _position, line in chosen]


def _relative(path: str, root: str | None) -> str:
    if root and path.startswith(root.rstrip("/") + "/"):
        return path[len(root.rstrip("/")) + 1 :]
    return path


def first_edit_question(
    case: Case, actions: Sequence[RecordedAction], texts: Sequence[tuple[int, str, str]]
) -> Question | str:
    """The question, or why it is omitted."""
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
