"""The state ledger: exact facts of a session, extracted from its history without a model.

Summaries keep the story and drop the details: a test count, a path, an exit code. The
ledger keeps those details verbatim and is appended to every summary, so they survive any
number of compaction cycles; it can also serve alone as a model-free summary.

Extraction understands native tool calls (OpenHands ``execute_bash``/``str_replace_editor``/
``task_tracker``...) and actions written as text (SWE-agent commands, ``<function=...>``
blocks). Everything it records is copied from the history; nothing is inferred.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec
import orjson

from policies.conversation import Message, message_text, role

MAX_GOAL_CHARS = 6000
MAX_ITEMS = 40

_TEST_SUMMARY = re.compile(
    r"\b\d+ (?:passed|failed|errors?|skipped|xfailed|xpassed|deselected|warnings?)\b"
    r"(?:, \d+ \w+)*(?: in [\d.]+s)?"
)
_ERROR_LINE = re.compile(
    r"^\s*(?:[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)|error|fatal|FAILED)\b[:\s].*"
)
_EXIT_CODE = re.compile(r"(?:exit code|exit_code|exited with code|Exit code)\D{0,3}(-?\d+)", re.IGNORECASE)
_TEXT_FUNCTION = re.compile(r"<function=([\w.-]+)>(.*?)(?:</function>|$)", re.DOTALL)
_TEXT_PARAMETER = re.compile(r"<parameter=([\w.-]+)>\n?(.*?)\n?</parameter>", re.DOTALL)
_SHELL_BLOCK = re.compile(r"```(?:bash|sh|shell)?\n(.*?)```", re.DOTALL)
_EDIT_COMMANDS = {"create", "str_replace", "insert", "undo_edit", "write", "edit", "append"}
_VIEW_COMMANDS = {"view", "open", "cat", "read"}


class FileRecord(msgspec.Struct, frozen=True):
    path: str
    views: int = 0
    edits: int = 0


class CommandRecord(msgspec.Struct, frozen=True):
    command: str
    exit_code: int | None = None


class Ledger(msgspec.Struct, frozen=True):
    goal: str = ""
    files: tuple[FileRecord, ...] = ()
    commands: tuple[CommandRecord, ...] = ()
    errors: tuple[str, ...] = ()
    test_summaries: tuple[str, ...] = ()
    open_items: tuple[str, ...] = ()
    handles: tuple[str, ...] = ()
    messages_seen: int = 0

    def merge(self, newer: Ledger) -> Ledger:
        """This ledger followed by what ``newer`` saw later (a later compaction cycle)."""
        files: dict[str, FileRecord] = {f.path: f for f in self.files}
        for record in newer.files:
            old = files.get(record.path)
            files[record.path] = (
                record
                if old is None
                else FileRecord(record.path, old.views + record.views, old.edits + record.edits)
            )
        return Ledger(
            goal=self.goal or newer.goal,
            files=tuple(files.values()),
            commands=self.commands + newer.commands,
            errors=_unique(self.errors + newer.errors),
            test_summaries=self.test_summaries + newer.test_summaries,
            open_items=newer.open_items if newer.open_items or newer.messages_seen else self.open_items,
            handles=_unique(self.handles + newer.handles),
            messages_seen=self.messages_seen + newer.messages_seen,
        )

    def with_handles(self, handles: Iterable[str]) -> Ledger:
        return msgspec.structs.replace(self, handles=_unique((*self.handles, *handles)))

    def render(self) -> str:
        """Markdown, stable for the same ledger (so the summary message is byte-stable)."""
        lines = ["## State ledger (exact, extracted from the history)"]
        if self.goal:
            lines += ["### Goal (first user message, verbatim)", self.goal]
        if self.files:
            lines.append("### Files")
            lines += [f"- {f.path} (viewed {f.views}x, edited {f.edits}x)" for f in self.files[-MAX_ITEMS:]]
        if self.commands:
            lines.append("### Commands run (exit code)")
            shown = self.commands[-MAX_ITEMS:]
            if len(self.commands) > len(shown):
                lines.append(f"- ... {len(self.commands) - len(shown)} earlier commands")
            lines += [
                f"- `{_one_line(c.command)}` -> {'?' if c.exit_code is None else c.exit_code}" for c in shown
            ]
        if self.errors:
            lines.append("### First error lines")
            lines += [f"- {e}" for e in self.errors[:MAX_ITEMS]]
        if self.test_summaries:
            lines.append("### Test summaries (in order)")
            lines += [f"- {t}" for t in self.test_summaries[-MAX_ITEMS:]]
        if self.open_items:
            lines.append("### Open items")
            lines += [f"- {t}" for t in self.open_items]
        if self.handles:
            lines.append("### Saved outputs (read with read_tool_output)")
            lines += [f"- handle={h}" for h in self.handles]
        return "\n".join(lines)


def _unique(items: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def _one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _arguments(call: Any) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    raw = function.get("arguments") if isinstance(function, dict) else None
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return {}


def actions_of(message: Message) -> list[tuple[str, dict[str, Any]]]:
    """(tool name, arguments) of every action in an assistant message, native or text."""
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        actions = []
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            name = function.get("name") if isinstance(function, dict) else None
            actions.append((name if isinstance(name, str) else "", _arguments(call)))
        return actions
    text = message_text(message)
    found = [
        (name, {k: v for k, v in _TEXT_PARAMETER.findall(body)})
        for name, body in _TEXT_FUNCTION.findall(text)
    ]
    if found:
        return found
    blocks = _SHELL_BLOCK.findall(text)
    return [("shell", {"command": block.strip()}) for block in blocks[-1:]]


def _file_action(name: str, args: dict[str, Any]) -> tuple[str, bool] | None:
    """(path, is_edit) for editor-like actions."""
    path = args.get("path") or args.get("file_path") or args.get("filename")
    command = str(args.get("command", "")).split(" ", 1)[0]
    if isinstance(path, str) and path:
        return path, command in _EDIT_COMMANDS or name in ("edit", "create", "write_file")
    if name in ("shell", "execute_bash", "bash") and command:
        words = command.split()
        if words and words[0] in ("open", "create", "edit") and len(words) > 1:
            return words[1], words[0] != "open"
    return None


def build_ledger(
    messages: Sequence[Message], start: int = 0, end: int | None = None, goal: str | None = None
) -> Ledger:
    """The ledger of ``messages[start:end]``; the goal is ``goal`` if given, else the first
    user message in range."""
    end = len(messages) if end is None else end
    goal = goal[:MAX_GOAL_CHARS] if goal else ""
    files: dict[str, FileRecord] = {}
    commands: list[CommandRecord] = []
    errors: list[str] = []
    tests: list[str] = []
    open_items: tuple[str, ...] = ()
    pending_commands: dict[str, int] = {}
    last_text_command: int | None = None
    for index in range(start, end):
        message = messages[index]
        kind = role(message)
        if kind == "user" and not goal:
            goal = message_text(message)[:MAX_GOAL_CHARS]
            continue
        if kind == "assistant":
            raw_calls = message.get("tool_calls")
            calls: list[Any] = raw_calls if isinstance(raw_calls, list) else []
            for position, (name, args) in enumerate(actions_of(message)):
                target = _file_action(name, args)
                if target:
                    path, is_edit = target
                    old = files.get(path, FileRecord(path))
                    files[path] = FileRecord(path, old.views + (not is_edit), old.edits + is_edit)
                command = args.get("command") if name in ("execute_bash", "bash", "shell", "run") else None
                if name == "task_tracker":
                    items = args.get("task_list")
                    if isinstance(items, list):
                        open_items = tuple(
                            _one_line(str(t.get("title") or t.get("description") or t))
                            for t in items
                            if isinstance(t, dict) and t.get("status") not in ("done", "completed")
                        )
                if isinstance(command, str) and command.strip():
                    commands.append(CommandRecord(command.strip()))
                    call = calls[position] if position < len(calls) else None
                    if isinstance(call, dict) and isinstance(call.get("id"), str):
                        pending_commands[call["id"]] = len(commands) - 1
                    else:
                        last_text_command = len(commands) - 1
            continue
        text = message_text(message)
        if kind == "tool" or (kind == "user" and index > start):
            slot = pending_commands.pop(message.get("tool_call_id", ""), None)
            if slot is None and kind == "user":
                slot, last_text_command = last_text_command, None
            exit_match = _EXIT_CODE.search(text[-400:]) if text else None
            if slot is not None and exit_match:
                commands[slot] = CommandRecord(commands[slot].command, int(exit_match.group(1)))
            for line in text.splitlines():
                if len(errors) < MAX_ITEMS and _ERROR_LINE.match(line) and line.strip() not in errors:
                    errors.append(line.strip()[:300])
                summary = _TEST_SUMMARY.search(line)
                if summary and ("passed" in line or "failed" in line or "error" in line):
                    tests.append(line.strip(" =")[:200])
    return Ledger(
        goal=goal,
        files=tuple(files.values()),
        commands=tuple(commands),
        errors=tuple(errors),
        test_summaries=tuple(tests),
        open_items=open_items,
        messages_seen=max(0, end - start),
    )
