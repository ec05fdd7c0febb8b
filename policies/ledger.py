"""The state ledger: exact facts of a session, extracted from its history without a model.

Summaries keep the story and drop the details: a test count, a path, an exit code. The
ledger keeps those details verbatim and is appended to every summary, so they survive any
number of compaction cycles; it can also serve alone as a model-free summary.

Extraction understands native tool calls (OpenHands ``execute_bash``/``str_replace_editor``/
``task_tracker``...) and actions written as text (SWE-agent commands, ``<function=...>``
blocks). Everything it records is copied from the history; nothing is inferred.

Two sections are never paraphrased (``ledger_records.py``): the user's words after the task,
verbatim and in order (observations of text-action agents are not the user's words), and,
when edits are artifacts, every edit by file in order with the handle its content is saved
under.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

import msgspec

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
from policies.handles import mention
from policies.ledger_records import (
    RENDER_LEVELS,
    UNBOUNDED,
    EditRecord,
    RenderLimits,
    TranscriptRecord,
    UserWords,
    render_edits,
    render_transcripts,
    render_user_words,
    saved_user_words,
)
from policies.message_actions import actions_of
from policies.output_lines import error_lines, summary_lines
from policies.shell_commands import exit_code

LEDGER_HEADING = "## State ledger (exact, extracted from the history)"
MAX_GOAL_CHARS = 6000
MAX_ITEMS = 40
# Saved outputs listed by handle (the newest); placeholders in the view name the others.
MAX_HANDLES = 100

_OPEN_FILE = re.compile(r"\(Open file: (/[^)\s]*)\)")


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
    # Every edit, in order (with the handle its content is saved under, when edits are artifacts).
    edits: tuple[EditRecord, ...] = ()
    # The user's messages after the task, verbatim, in order.
    user_words: tuple[UserWords, ...] = ()
    # With transcripts: where each summary's replaced messages are saved verbatim, oldest first.
    transcripts: tuple[TranscriptRecord, ...] = ()

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
            edits=self.edits + newer.edits,
            user_words=self.user_words + newer.user_words,
            transcripts=self.transcripts + newer.transcripts,
        )

    def with_handles(self, handles: Iterable[str]) -> Ledger:
        return msgspec.structs.replace(self, handles=_unique((*self.handles, *handles)))

    def with_transcript(self, record: TranscriptRecord) -> Ledger:
        return msgspec.structs.replace(self, transcripts=(*self.transcripts, record))

    def with_kept(self, texts: Collection[str]) -> Ledger:
        """The user's words the view keeps verbatim after the summary are shown there, not twice
        (a message summarized once can become the pinned last user message later); the others,
        one kept by an earlier summary included, are shown in the ledger."""
        if all(w.kept == (w.text in texts) for w in self.user_words):
            return self
        words = tuple(UserWords(w.text, kept=w.text in texts) for w in self.user_words)
        return msgspec.structs.replace(self, user_words=words)

    def saved_texts(self, limits: RenderLimits | None = None) -> dict[str, str]:
        """Handle -> text of what the ledger names by handle besides saved outputs and edits
        (long user messages, at ``limits``): stored by the proxy before a view names them."""
        return saved_user_words(self.user_words, (limits or RenderLimits()).user_chars)

    def _file_lines(self, limits: RenderLimits) -> list[str]:
        edited = {e.path for e in self.edits}
        # Every file with a recorded edit is listed (the newest ones past the limit); of the
        # others, the newest.
        edited_shown = set(list(dict.fromkeys(e.path for e in self.edits))[-max(limits.items, 1) :])
        others = [f for f in self.files if f.path not in edited]
        shown = {f.path for f in others[-max(0, limits.items - len(edited_shown)) :]} | edited_shown
        lines = []
        for record in self.files:
            if record.path not in shown:
                continue
            line = f"- {record.path} (viewed {record.views}x, edited {record.edits}x)"
            if record.path in edited:
                line += f"; edits in order: {render_edits(self.edits, record.path, limits)}"
            lines.append(line)
        if len(shown) < len(self.files):
            lines.append(f"- ... {len(self.files) - len(shown)} more files")
        return lines

    def render(self, limits: RenderLimits | None = None) -> str:
        """Markdown, stable for the same ledger and limits (so the summary is byte-stable)."""
        limits = limits or RenderLimits()
        items = limits.items
        lines = [LEDGER_HEADING]
        if self.goal and self.task_kept:
            lines += ["### Goal", "The task: the first user message, kept verbatim above this summary."]
        elif self.goal:
            lines += ["### Goal (first user message, verbatim)", self.goal]
        lines += render_user_words(self.user_words, limits.user_chars)
        if self.files:
            lines.append("### Files")
            lines += self._file_lines(limits)
        if self.commands:
            lines.append("### Commands run (exit code)")
            shown = self.commands[-items:]
            if len(self.commands) > len(shown):
                lines.append(f"- ... {len(self.commands) - len(shown)} earlier commands")
            lines += [
                f"- `{_one_line(c.command)}` -> {'?' if c.exit_code is None else c.exit_code}" for c in shown
            ]
        if self.errors:
            lines.append("### First error lines")
            lines += [f"- {e}" for e in self.errors[:items]]
            if len(self.errors) > items:
                lines.append(f"- ... {len(self.errors) - items} more")
        if self.test_summaries:
            lines.append("### Test summaries (in order)")
            if len(self.test_summaries) > items:
                lines.append(f"- ... {len(self.test_summaries) - items} earlier")
            lines += [f"- {t}" for t in self.test_summaries[-items:]]
        if self.open_items:
            lines.append("### Open items")
            lines += [f"- {t}" for t in self.open_items[:items]]
        named = (
            {e.handle for e in self.edits}
            | set(self.saved_texts(limits))
            | set(self.saved_texts())
            | {t.handle for t in self.transcripts}
        )
        handles = [h for h in self.handles if h not in named]
        if handles:
            lines.append("### Saved outputs (read with read_tool_output)")
            shown_handles = handles[-limits.handles :]
            if len(handles) > len(shown_handles):
                lines.append(f"- ... {len(handles) - len(shown_handles)} earlier saved outputs")
            lines += [f"- {mention(h)}" for h in shown_handles]
        lines += render_transcripts(self.transcripts, limits)
        return "\n".join(lines)

    def render_within(self, fits: Callable[[str], bool]) -> tuple[str, RenderLimits, str | None]:
        """The fullest rendering that ``fits`` (else the smallest), its limits, and, when a
        list had to be cut, the complete rendering (which the caller saves under a handle)."""
        first = self.render()
        if fits(first):
            return first, RENDER_LEVELS[0], None
        complete = self.render(UNBOUNDED)
        for limits in RENDER_LEVELS[1:]:
            text = self.render(limits)
            if fits(text):
                return text, limits, complete
        return text, RENDER_LEVELS[-1], complete


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
