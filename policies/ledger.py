"""The state ledger: exact facts of a session, extracted from its history without a model.

Summaries keep the story and drop the details: a test count, a path, an exit code. The
ledger keeps those details verbatim and is appended to every summary, so they survive any
number of compaction cycles; it can also serve alone as a model-free summary.

It is extracted from the history by ``ledger_extraction.py`` (``build_ledger``): everything it
records is copied from the history; nothing is inferred.

Two sections are never paraphrased (``ledger_records.py``): the user's words after the task,
verbatim and in order (observations of text-action agents are not the user's words), and,
when edits are artifacts, every edit by file in order with the handle its content is saved
under.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence

import msgspec

from policies.handles import mention
from policies.ledger_records import (
    RENDER_LEVELS,
    UNBOUNDED,
    EditRecord,
    RenderLimits,
    SupersededRecord,
    TranscriptRecord,
    UserWords,
    render_edits,
    render_superseded,
    render_transcripts,
)
from policies.ledger_user_words import render_user_words, saved_user_words

LEDGER_HEADING = "## State ledger (exact, extracted from the history)"
# Saved outputs listed by handle (the newest); placeholders in the view name the others.
MAX_HANDLES = 100


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
    # Outputs a later step made obsolete (a file read again or edited, a command run again), in order.
    superseded: tuple[SupersededRecord, ...] = ()

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
            superseded=self.superseded + newer.superseded,
        )

    def with_handles(self, handles: Iterable[str]) -> Ledger:
        return msgspec.structs.replace(self, handles=_unique((*self.handles, *handles)))

    def with_superseded(self, records: Sequence[SupersededRecord]) -> Ledger:
        return msgspec.structs.replace(self, superseded=(*self.superseded, *records)) if records else self

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
            | {r.handle for r in self.superseded}
        )
        superseded, listed = render_superseded(self.superseded, limits.handles)
        lines += superseded
        handles = [h for h in self.handles if h not in named]
        if handles:
            lines.append("### Saved outputs (read with read_tool_output)")
            shown_handles = handles[-(limits.handles - listed) :] if limits.handles > listed else []
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
