"""The state ledger extracted from a history, without a model (``ledger.py`` is the ledger).

Extraction understands native tool calls (OpenHands ``execute_bash``/``str_replace_editor``/
``task_tracker``...) and actions written as text (SWE-agent commands, ``<function=...>``
blocks), reading the messages in order: files viewed and edited, commands and their exit
codes, errors, test summaries, open items, edits as artifacts, the user's own words.
Everything it records is copied from the history; nothing is inferred."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Any

from policies.actions import EDIT, PATCH, READ, SHELL, WRITE, Action
from policies.artifacts import edit_artifact
from policies.conversation import (
    Message,
    is_harness_preamble,
    is_labelled_observation,
    message_text,
    parse,
    result_id,
    role,
)
from policies.ledger import CommandRecord, FileRecord, Ledger
from policies.ledger_records import (
    EditRecord,
    UserWords,
)
from policies.message_actions import actions_of
from policies.output_lines import error_lines, summary_lines
from policies.shell_commands import exit_code

MAX_GOAL_CHARS = 6000


MAX_ITEMS = 40


_OPEN_FILE = re.compile(r"\(Open file: (/[^)\s]*)\)")


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
    kept: Collection[int] = (),
    artifacts: dict[str, tuple[str, str]] | None = None,
) -> Ledger:
    """The ledger of ``messages[start:end]``. The goal is ``goal`` if given, else the
    conversation's task (its first user message, wherever the range starts); ``task_kept``
    says the view keeps that message verbatim before the summary, so it is not repeated.
    ``kept``: indices of messages the view keeps verbatim after the summary. With
    ``artifacts`` (a dict, filled with handle -> (saved text, description)), edits are
    artifacts: each is listed under its file with the handle its content is saved under."""
    end = len(messages) if end is None else end
    goal = (goal if goal else task_text(messages))[:MAX_GOAL_CHARS]
    builder = _Builder(messages, artifacts)
    for index in range(start, end):
        builder.read(index, index in kept)
    return Ledger(
        goal=goal,
        task_kept=task_kept,
        files=tuple(builder.files.values()),
        commands=tuple(builder.commands),
        errors=tuple(builder.errors),
        test_summaries=tuple(builder.tests),
        open_items=builder.open_items,
        messages_seen=max(0, end - start),
        edits=tuple(builder.edits),
        user_words=tuple(builder.user_words),
    )


# A shell command that writes a file is listed under Commands; saved only when longer.
_SHELL_SHOWN_CHARS = 200


class _Builder:
    """What ``build_ledger`` collects while it reads the messages in order."""

    def __init__(self, messages: Sequence[Message], artifacts: dict[str, tuple[str, str]] | None) -> None:
        self.messages = messages
        conversation = parse(messages)
        self.text_agent = conversation.text_actions
        self.first_user = conversation.first_user
        # The user's own turns (never a text action's observation), as the conversation model reads them.
        self.user_turns = {s.start for s in conversation.steps if s.kind == "user"}
        self.artifacts = artifacts
        self.files: dict[str, FileRecord] = {}
        self.commands: list[CommandRecord] = []
        self.errors: list[str] = []
        self.tests: list[str] = []
        self.open_items: tuple[str, ...] = ()
        self.edits: list[EditRecord] = []
        self.user_words: list[UserWords] = []
        self.pending_commands: dict[str, int] = {}
        self.last_text_command: int | None = None
        self.open_file: str | None = None  # SWE-agent's edits name no path: the open file's

    def touch(self, path: str, edit: bool) -> None:
        old = self.files.get(path, FileRecord(path))
        self.files[path] = FileRecord(path, old.views + (not edit), old.edits + edit)

    def read(self, index: int, kept: bool) -> None:
        message = self.messages[index]
        kind = role(message)
        if kind == "assistant":
            self.assistant(message)
            return
        previous = self.messages[index - 1] if index > 0 else None
        observation = (
            kind == "user"
            and role(previous) == "assistant"
            and not (previous or {}).get("tool_calls")
            and (self.text_agent or is_labelled_observation(message))
        )
        if kind == "user" and not observation:
            # The user's own words are instructions, never tool output: kept verbatim.
            if index in self.user_turns and index > self.first_user >= 0 and not is_harness_preamble(message):
                self.user_words.append(UserWords(message_text(message), kept=kept))
            return
        if kind == "tool" or observation:
            self.output(message, kind == "tool")

    def assistant(self, message: Message) -> None:
        raw_calls = message.get("tool_calls")
        calls: list[Any] = raw_calls if isinstance(raw_calls, list) else []
        self.last_text_command = None
        for position, action in enumerate(actions_of(message)):
            if action.kind in (EDIT, WRITE, READ) and action.path:
                self.touch(action.path, action.kind != READ)
            elif action.kind == PATCH:
                for path in action.paths or ((action.path,) if action.path else ()):
                    self.touch(path, True)
            elif action.kind == SHELL:
                for path in action.paths:
                    self.touch(path, True)
                if action.path:
                    self.touch(action.path, False)
            if self.artifacts is not None:
                self.edit(action)
            if action.tool in ("open", "create") and action.path:
                self.open_file = action.path
            items = action.open_items()
            if items is not None:
                self.open_items = items
            if action.kind == SHELL and action.command and action.command.strip():
                self.commands.append(CommandRecord(action.command.strip()))
                call = calls[position] if position < len(calls) else None
                if isinstance(call, dict) and isinstance(call.get("id"), str):
                    self.pending_commands[call["id"]] = len(self.commands) - 1
                else:
                    self.last_text_command = len(self.commands) - 1

    def edit(self, action: Action) -> None:
        """An edit, listed under each file it writes, its content saved under its handle."""
        artifact = edit_artifact(action)
        if artifact is None or self.artifacts is None:
            return
        paths = artifact.paths
        if not paths and action.kind == SHELL:
            return  # a script in a heredoc (``python - <<EOF``) edits no file
        if not paths:
            # SWE-agent's ``edit 3:5 ... end_of_edit`` edits the open file.
            paths = (self.open_file or "(file unknown)",)
            self.touch(paths[0], True)
        handle = artifact.handle
        if artifact.label == "shell" and len(action.command or "") <= _SHELL_SHOWN_CHARS:
            handle = ""  # listed whole under Commands
        else:
            self.artifacts[handle] = (artifact.text, artifact.description())
        self.edits += [EditRecord(path, artifact.label, handle, artifact.size) for path in paths]

    def output(self, message: Message, native: bool) -> None:
        text = message_text(message)
        slot = self.pending_commands.pop(result_id(message) or "", None) if native else None
        if slot is None and not native:
            slot, self.last_text_command = self.last_text_command, None
        code = exit_code(text) if text else None
        if slot is not None and code is not None:
            self.commands[slot] = CommandRecord(self.commands[slot].command, code)
        opened = _OPEN_FILE.findall(text[-2000:]) if "(Open file: " in text else []
        if opened:
            self.open_file = opened[-1]
        for line in error_lines(text):
            if len(self.errors) >= MAX_ITEMS:
                break
            if line.strip() not in self.errors:
                self.errors.append(line.strip()[:300])
        self.tests += [line.strip(" =")[:200] for line in summary_lines(text)]
