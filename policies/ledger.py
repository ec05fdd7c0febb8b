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

from policies.actions import EDIT, PATCH, READ, SHELL, WRITE, actions_of
from policies.conversation import Message, message_text, parse, result_id, role
from policies.handles import mention
from policies.shell_commands import exit_code

MAX_GOAL_CHARS = 6000
MAX_ITEMS = 40
# Saved outputs listed by handle (the newest); placeholders in the view name the others.
MAX_HANDLES = 100

_TEST_SUMMARY = re.compile(
    r"\b\d+ (?:passed|failed|errors?|skipped|xfailed|xpassed|deselected|warnings?)\b"
    r"(?:, \d+ \w+)*(?: in [\d.]+s)?"
)
_ERROR_LINE = re.compile(
    r"^\s*(?:[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)|error|fatal|FAILED)\b[:\s].*"
)


class FileRecord(msgspec.Struct, frozen=True):
    path: str
    views: int = 0
    edits: int = 0


class CommandRecord(msgspec.Struct, frozen=True):
    command: str
    exit_code: int | None = None


class Ledger(msgspec.Struct, frozen=True):
    goal: str = ""
    # The goal is the first user message, which the view keeps verbatim before the summary.
    task_kept: bool = False
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
            task_kept=self.task_kept,
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
        if self.goal and self.task_kept:
            lines += ["### Goal", "The task: the first user message, kept verbatim above this summary."]
        elif self.goal:
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
            shown_handles = self.handles[-MAX_HANDLES:]
            if len(self.handles) > len(shown_handles):
                lines.append(f"- ... {len(self.handles) - len(shown_handles)} earlier saved outputs")
            lines += [f"- {mention(h)}" for h in shown_handles]
        return "\n".join(lines)


def _unique(items: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def _one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def task_text(messages: Sequence[Message]) -> str:
    """The conversation's task: its first user message (never an observation: the first user
    message comes before any action)."""
    for message in messages:
        if role(message) == "user":
            return message_text(message)
    return ""


def build_ledger(
    messages: Sequence[Message],
    start: int = 0,
    end: int | None = None,
    goal: str | None = None,
    *,
    task_kept: bool = False,
) -> Ledger:
    """The ledger of ``messages[start:end]``. The goal is ``goal`` if given, else the
    conversation's task (its first user message, wherever the range starts); ``task_kept``
    says the view keeps that message verbatim before the summary, so it is not repeated."""
    end = len(messages) if end is None else end
    goal = (goal if goal else task_text(messages))[:MAX_GOAL_CHARS]
    text_agent = parse(messages).text_actions
    files: dict[str, FileRecord] = {}
    commands: list[CommandRecord] = []
    errors: list[str] = []
    tests: list[str] = []
    open_items: tuple[str, ...] = ()
    pending_commands: dict[str, int] = {}
    last_text_command: int | None = None

    def touch(path: str, edit: bool) -> None:
        old = files.get(path, FileRecord(path))
        files[path] = FileRecord(path, old.views + (not edit), old.edits + edit)

    for index in range(start, end):
        message = messages[index]
        kind = role(message)
        if kind == "assistant":
            raw_calls = message.get("tool_calls")
            calls: list[Any] = raw_calls if isinstance(raw_calls, list) else []
            last_text_command = None
            for position, action in enumerate(actions_of(message)):
                if action.kind in (EDIT, WRITE, READ) and action.path:
                    touch(action.path, action.kind != READ)
                elif action.kind == PATCH:
                    for path in action.paths or ((action.path,) if action.path else ()):
                        touch(path, True)
                elif action.kind == SHELL:
                    for path in action.paths:
                        touch(path, True)
                    if action.path:
                        touch(action.path, False)
                items = action.open_items()
                if items is not None:
                    open_items = items
                if action.kind == SHELL and action.command and action.command.strip():
                    commands.append(CommandRecord(action.command.strip()))
                    call = calls[position] if position < len(calls) else None
                    if isinstance(call, dict) and isinstance(call.get("id"), str):
                        pending_commands[call["id"]] = len(commands) - 1
                    else:
                        last_text_command = len(commands) - 1
            continue
        observation = (
            kind == "user"
            and text_agent
            and index > 0
            and role(messages[index - 1]) == "assistant"
            and not messages[index - 1].get("tool_calls")
        )
        if kind != "tool" and not observation:
            continue  # the user's own words are instructions, never tool output
        text = message_text(message)
        slot = pending_commands.pop(result_id(message) or "", None) if kind == "tool" else None
        if slot is None and observation:
            slot, last_text_command = last_text_command, None
        code = exit_code(text) if text else None
        if slot is not None and code is not None:
            commands[slot] = CommandRecord(commands[slot].command, code)
        for line in text.splitlines():
            if len(errors) < MAX_ITEMS and _ERROR_LINE.match(line) and line.strip() not in errors:
                errors.append(line.strip()[:300])
            summary = _TEST_SUMMARY.search(line)
            if summary and ("passed" in line or "failed" in line or "error" in line):
                tests.append(line.strip(" =")[:200])
    return Ledger(
        goal=goal,
        task_kept=task_kept,
        files=tuple(files.values()),
        commands=tuple(commands),
        errors=tuple(errors),
        test_summaries=tuple(tests),
        open_items=open_items,
        messages_seen=max(0, end - start),
    )
