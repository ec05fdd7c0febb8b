"""Reading shell commands and patches: the command line of an argv call, the files a command
writes or shows, and the files an ``apply_patch`` envelope or a unified diff touches.

Part of the action vocabulary (``policies.actions``); heuristics copied from what agents really
type, never executed.
"""

from __future__ import annotations

import functools
import re
import shlex
from typing import Any

_SHELLS = frozenset({"bash", "sh", "zsh"})
_SCRIPT_FLAGS = frozenset({"-c", "-lc", "-lic", "-ic"})


def shell_command(value: Any) -> str | None:
    """A shell call's command as one line: a string as is; an argv list joined, with a
    ``bash -lc SCRIPT`` wrapper (Codex CLI's ``shell``) reduced to its script."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        argv: list[str] = value
        if len(argv) >= 3 and argv[0].rsplit("/", 1)[-1] in _SHELLS and argv[1] in _SCRIPT_FLAGS:
            return argv[2]
        return shlex.join(argv)
    return None


# --- apply_patch envelopes and unified diffs --------------------------------------------------

_ENVELOPE_FILE = re.compile(r"^\*\*\* (Add|Update|Delete) File: (.+?)\s*$", re.MULTILINE)
_ENVELOPE_MOVE = re.compile(r"^\*\*\* Move to: (.+?)\s*$", re.MULTILINE)
_DIFF_FILE = re.compile(r"^\+\+\+ (?:b/)?(\S+)", re.MULTILINE)
_DIFF_GIT = re.compile(r"^diff --git a/(\S+) b/(\S+)", re.MULTILINE)


def is_patch(text: str) -> bool:
    head = text.lstrip()[:200]
    return (
        head.startswith("*** Begin Patch")
        or head.startswith("diff --git")
        or (head.startswith("--- ") and "\n+++ " in text[:2000])
    )


def patch_paths(text: str) -> tuple[str, ...]:
    """Files an ``apply_patch`` envelope or a unified diff touches, in order."""
    found = [m.group(2) for m in _ENVELOPE_FILE.finditer(text)]
    found += _ENVELOPE_MOVE.findall(text)
    if not found:
        found = [m.group(2) for m in _DIFF_GIT.finditer(text)] or [
            p for p in _DIFF_FILE.findall(text) if p != "/dev/null"
        ]
    return tuple(dict.fromkeys(found))


def patch_added_text(text: str) -> str:
    """The lines a patch adds (without their ``+``)."""
    return "\n".join(
        line[1:] for line in text.splitlines() if line.startswith("+") and not line.startswith("+++")
    )


# --- files shell commands write or read ------------------------------------------------------

_QUOTED = re.compile(r"'[^']*'|\"(?:[^\"\\]|\\.)*\"")
HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_]\w*)\1[^\n]*\n(.*?)^\s*\2\s*$", re.DOTALL | re.MULTILINE)
_REDIRECT = re.compile(r"(?:^|[^\d&<>])(?:>>?|&>)\s*([^\s;&|<>()]+)")
_SEGMENT = re.compile(r"&&|\|\||[;|\n]")
_WRITERS = frozenset({"cat", "echo", "printf"})
_PY_WRITE = re.compile(r"""open\(\s*(['"])([^'"]+)\1\s*,\s*(['"])[wax]""")
_READERS = frozenset({"cat", "head", "tail", "nl", "less", "more", "bat"})
# Substrings without which a command writes no file the way shell_write_targets reads them.
_WRITE_MARKS = (">", "tee", "sed", "perl", "patch", "git", "python", "<<")


def shell_write_targets(command: str) -> list[str | None]:
    """Files a shell command writes (None: somewhere unknown, e.g. ``git apply``)."""
    targets: list[str | None] = []
    if not any(mark in command for mark in _WRITE_MARKS):
        return targets  # cheap: no redirection, tee, in-place edit, patch or python here
    heredocs = HEREDOC.findall(command)
    bare = HEREDOC.sub("<<HEREDOC\n", command)
    for _quote, _marker, body in heredocs:
        targets.extend(m.group(2) for m in _PY_WRITE.finditer(body))
        if body.lstrip().startswith("*** Begin Patch"):
            targets.extend(patch_paths(body))
    unquoted = _QUOTED.sub("''", bare)
    for segment in _SEGMENT.split(unquoted):
        words = segment.split()
        if not words:
            continue
        program = words[0]
        if program in ("sudo", "env") and len(words) > 1:
            words = words[1:]
            program = words[0]
        if program in _WRITERS or "<<HEREDOC" in segment:
            targets.extend(
                t for t in _REDIRECT.findall(segment) if not t.startswith("/dev/") and t not in ("-", "''")
            )
        if program == "tee":
            targets.extend(w for w in words[1:] if not w.startswith("-") and w != "''")
        if program in ("sed", "perl") and any(
            w.startswith("-i") or w == "--in-place" or (w.startswith("-") and "i" in w and program == "perl")
            for w in words[1:]
        ):
            files = [w for w in words[1:] if not w.startswith("-") and w != "''"]
            targets.append(files[-1] if files else None)
        if program == "patch" or (program == "git" and len(words) > 1 and words[1] in ("apply", "am")):
            targets.append(None)
    if re.search(r"\bpython[\d.]*\s+-c\b", bare):
        targets.extend(m.group(2) for m in _PY_WRITE.finditer(bare))
        if not _PY_WRITE.search(bare) and re.search(r"\.write_text\(|\.write\(", bare):
            targets.append(None)
    return targets


# Options of head and tail whose value is the next word (``head -n 60 f``): not a file.
_VALUE_FLAGS = frozenset({"-n", "-c", "--lines", "--bytes"})


def _operands(words: list[str], value_flags: frozenset[str]) -> list[str]:
    """The words that are not options, nor the value of an option in ``value_flags``."""
    operands: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word in value_flags:
            skip = True
        elif not word.startswith("-"):
            operands.append(word)
    return operands


def shell_read_target(command: str) -> str | None:
    """The file a simple reading command shows (``cat f``, ``head -n 5 f``, ``sed -n 1,9p f``)."""
    if "\n" in command.strip() or "|" in command or ">" in command:
        return None
    first = command.split(maxsplit=1)[0] if command.strip() else ""
    if first not in _READERS and first != "sed":
        return None  # cheap: most commands are not a plain read
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if not words:
        return None
    program = words[0]
    files = _operands(words[1:], _VALUE_FLAGS if program in ("head", "tail") else frozenset())
    if program in _READERS and len(files) == 1 and not files[0].isdigit():
        return files[0]
    if program == "sed" and "-n" in words and len(files) == 2:
        return files[1]
    return None


# --- what a shell command reported -----------------------------------------------------------

# (One alternation per prefix: a further alternative, like "<returncode>", makes the search of
# every output's tail four times slower; mini-swe-agent's leading form has its own pattern.)
_EXIT_CODE = re.compile(r"(?:exit code|exit_code|exited with code)\D{0,3}(-?\d+)", re.IGNORECASE)
_LEADING_RETURNCODE = re.compile(r"^\s*(?:<returncode>|\{\s*\"returncode\"\s*:\s*)(-?\d+)")
_JSON_RETURNCODE = re.compile(r"\"(?:returncode|exit_code)\"\s*:\s*(-?\d+)")


# Asked of the same output by several stages at every compaction point (did it fail, its
# description, the ledger): a pure function's memo, bounded.
@functools.lru_cache(maxsize=8192)
def exit_code(output: str) -> int | None:
    """The exit code an output reports: at its end (OpenHands, Codex, most harnesses), or
    mini-swe-agent's leading ``<returncode>N</returncode>`` (text mode) or its JSON
    ``{"returncode": N, ...}`` (tool-call mode)."""
    match = (
        _EXIT_CODE.search(output[-400:])
        or _LEADING_RETURNCODE.match(output)
        or (_JSON_RETURNCODE.search(output[:200]) if output[:64].lstrip().startswith("{") else None)
    )
    return int(match.group(1)) if match else None
