"""Superseded and stale outputs: an output a later step made obsolete leaves the view for a
one-line note with its handle.

A tool output that shows a file (what ``policies/actions.py`` reads as a ``read`` with a path,
on every door: ``str_replace_editor view``, ``Read``, ``read_file``, ``open f``, and ``cat``,
``head``, ``tail``, ``nl``, ``sed -n`` through a shell) is

- *superseded* once a later step reads the same file again (any part of it), and
- *stale* when, besides, a later step edited the file (an edit, a write, a patch, a shell
  command that writes it): what it shows is no longer what the file holds;

likewise a command's output is superseded once a later step runs the same command (its
whitespace folded). The newest read of a file and the newest run of a command always stay:
they are the model's current picture (``stale_newest`` also lets a newest read go once the file
was edited after it). A later read that failed (no such file, a bad range) supersedes nothing.
Reads and runs in the same step are the model's one move (parallel calls): only a later step
counts.

The note keeps the placeholder's prefix and, on one line, says why the output went, what it was
(the file or command, its size, its exit code) and the handle its whole text is saved under (an
``Offload``: the proxy saves it before it sends a view that names it), so a question about an
early read of a file edited since is answered by reading the handle. The state ledger of a
later summary lists every note under "Superseded outputs" (``policies/ledger.py``).

When:

- at a compaction point (this stage placed after the trigger): every output after the summary
  but those of the newest step that produced output (what the model is answering now);
- between points: only the outputs of the previous request's tail (its newest step with output,
  what the next step can make obsolete), so everything the provider's prompt cache holds
  before it stays byte for byte, as ``tail_offload`` does; not a compaction point;
- an output of at most ``min_chars`` characters stays (its note would save nothing), and so do
  pinned steps, placeholders and excerpts (their handle already holds the text);
- only tool calls are actions in a tool-calling conversation (an assistant's prose with a code
  block runs nothing); text actions count only for an agent that acts in text;
- the decision is sticky: later requests carry the same note, byte for byte.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import ClassVar

import msgspec
import orjson

from policies.actions import SHELL
from policies.conversation import Step, message_text
from policies.facts import SupersededFact
from policies.handles import is_excerpt, is_placeholder, new_handle, superseded_text
from policies.shell_commands import exit_code
from policies.stages.outputs import describe, failed
from policies.stages.prefix_rewrite import (
    Note,
    exchanges_after,
    paying_notes,
    producing_steps,
    retargeted_steps,
    retargets,
)
from policies.stages.step_outputs import (
    Output,
    previous_tail,
    recent_steps,
    step_calls,
    written_paths,
)
from policies.stages.summary_state import summary_index
from policies.view import Context, Offload, View

# A command is named by its first characters in a note (and the ledger's line of its notes).
_TARGET_CHARS = 120
# Arguments of a read that name its file or sub-command, not the part of the file it shows.
_NOT_SCOPE = frozenset({"command", "path", "file_path", "filepath", "absolute_path", "filename", "file"})


class SupersededReads(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: ClassVar[str] = "superseded_reads"
    # An output this long (in characters) or shorter stays: a note would save nothing.
    min_chars: int = 300
    # Command outputs too, once the same command ran again.
    commands: bool = True
    # The newest read of a file too, once a later step edited the file.
    stale_newest: bool = False

    # Between points, with the provider's prompt cache known: reach before the previous tail
    # when the cache has expired, or when the rewrite pays (``prefix_rewrite.py``).
    cache_aware: bool = True
    # How many times over the tokens saved ahead must pay for the cache a rewrite loses.
    payback: float = 2.0

    def __post_init__(self) -> None:
        if self.min_chars < 0:
            raise ValueError("min_chars must be >= 0")
        if self.payback <= 0:
            raise ValueError("payback must be > 0")

    async def apply(self, view: View, ctx: Context) -> View:
        steps, text_actions = _steps(view)
        producing = [s for s in steps if s.kind in ("exchange", "observation")]
        if len(producing) < 2:
            return view
        protected_from = producing[-1].start
        summary = summary_index(view)
        after_summary = 0 if summary is None else summary + 1
        first = max(after_summary, 0 if view.compacting else previous_tail(steps, protected_from))
        notes = []
        if first < protected_from:
            found = self._decide(view, steps, text_actions, first, protected_from)
            notes = self._notes(view, ctx, found)
        rewrite = "point" if view.compacting else "tail"
        deeper = self._deeper(view, ctx, steps, text_actions, after_summary, first)
        if deeper is not None:
            notes, rewrite = [*deeper[0], *notes], deeper[1]
        if not notes:
            return view
        self._replace(view, ctx, notes, rewrite)
        return view

    def _deeper(
        self,
        view: View,
        ctx: Context,
        recent: Sequence[Step],
        text_actions: bool,
        after_summary: int,
        first: int,
    ) -> tuple[list[Note], str] | None:
        """Between points, with the provider's cache known: the notes before the previous tail
        that go now, all of them when the cache has expired (the prefix is a miss anyway), else
        those from the point on where the tokens saved on the requests ahead pay for the
        cached tokens the rewrite loses (``prefix_rewrite.py``); None: none go."""
        cache = ctx.cache
        if view.compacting or not self.cache_aware or cache is None or first <= after_summary:
            return None
        if cache.cold or text_actions:
            if not cache.cold and not retargets(view.messages, recent, after_summary, first, text_actions):
                return None
            conversation = view.conversation()
            found = self._decide(view, conversation.steps, conversation.text_actions, after_summary, first)
            producing = producing_steps(conversation.steps, after_summary)
        else:
            # A warm prefix of a tool-calling agent: only the earlier steps that name what the
            # newest steps re-read or re-ran are looked at (a full parse on every such request
            # would cost each step a millisecond at 100k tokens), and only their outputs of
            # those very files and commands go.
            keys, earlier = retargeted_steps(view.messages, recent, after_summary, first)
            if not earlier:
                return None
            later = [s for s in recent if s.start >= first]
            found = [
                f
                for f in self._decide(view, [*earlier, *later], False, after_summary, first)
                if f[1].key in keys
            ]
            producing = exchanges_after(view.messages, after_summary)
        notes = self._notes(view, ctx, found)
        if not notes:
            return None
        if cache.cold:
            return notes, "cold"
        chosen = paying_notes(view, ctx, notes, producing, after_summary, self.payback)
        return (chosen, "paid") if chosen else None

    def _notes(
        self, view: View, ctx: Context, found: list[tuple[int, Output, tuple[str, str]]]
    ) -> list[Note]:
        """The note each obsolete output would become, but for those that stay: the client's
        own messages only, not pinned, long enough, not already behind a handle, and only when
        the note is shorter."""
        if not found:
            return []
        pinned = ctx.pins.pinned_steps(view.messages)
        notes = []
        for index, output, (status, why) in found:
            text = message_text(view.messages[index])
            if view.origin[index] < 0 or index in pinned or len(text) <= self.min_chars:
                continue
            if is_placeholder(text) or is_excerpt(text):
                continue  # its handle already holds the text
            handle = new_handle(text)
            note = superseded_text(handle, status, why, _target(output), _size(output, text))
            if len(note) < len(text):
                notes.append(Note(index, output, handle, note, text))
        return notes

    def _replace(self, view: View, ctx: Context, notes: list[Note], rewrite: str) -> None:
        placeholders = dict(view.checkpoint.placeholders)
        replaced = list(view.messages)
        reads = runs = 0
        for note in notes:
            output, index = note.output, note.index
            source = view.origin[index]
            what = f"{_target(output)} {_part(output)}".strip()
            view.offloads[note.handle] = Offload(
                note.handle, note.text, describe(output.action.tool, what, note.text)
            )
            replaced[index] = {**view.messages[index], "content": note.note}
            placeholders[ctx.digests.at(source, view.original[source])] = replaced[index]
            reads += output.key is not None and output.key[0] == "read"
            runs += output.key is not None and output.key[0] == "run"
        view.replace_messages(replaced, self.name, origin=list(view.origin))
        view.remember_replacements(placeholders)
        handles = tuple(n.handle for n in notes)
        view.facts.superseded_reads = SupersededFact(
            reads=reads, commands=runs, handles=handles, rewrite=rewrite
        )
        if rewrite in ("cold", "paid"):
            # The provider writes the prefix anew from the first note: the trigger's grace.
            view.checkpoint = replace(view.checkpoint, prefix_written_at=view.checkpoint.requests)
        # A decision at a compaction point is one of its decisions; between points it is not one.
        view.decided = view.decided or view.compacting

    def _decide(
        self, view: View, steps: Sequence[Step], text_actions: bool, first: int, protected_from: int
    ) -> list[tuple[int, Output, tuple[str, str]]]:
        """The outputs in view ``[first, protected_from)`` a later step made obsolete: each
        one's index, its action and key, and its status and why. The steps are read newest
        first, so each output is judged by what the steps after it did: files read (by a read
        that did not fail), files edited, commands run. What a step did is read from its calls,
        answered or not: a request that adds a step's results one by one sees the same events
        at each one, so a decision made on one is the decision on the next."""
        read_later: set[str] = set()
        edited_later: set[str] = set()
        ran_later: set[str] = set()
        found: list[tuple[int, Output, tuple[str, str]]] = []
        for step in reversed(steps):
            if step.end <= first:
                break
            calls = step_calls(view.messages, step, text_actions)
            if first <= step.start < protected_from:
                for output in calls:
                    verdict = self._verdict(output, read_later, edited_later, ran_later)
                    if output.index is not None and verdict is not None:
                        found.append((output.index, output, verdict))
            for output in calls:
                kind, target = output.key or ("", "")
                if kind == "run":
                    ran_later.add(target)
                elif kind == "read" and (output.index is None or not _failed(view, output.index)):
                    read_later.add(target)
                edited_later.update(written_paths(output.action))
        found.reverse()
        return found

    def _verdict(
        self, output: Output, read_later: set[str], edited_later: set[str], ran_later: set[str]
    ) -> tuple[str, str] | None:
        if output.key is None:
            return None
        kind, target = output.key
        if kind == "run":
            return ("Superseded", "ran again later") if self.commands and target in ran_later else None
        edited = target in edited_later
        if target in read_later:
            return ("Stale", "edited and read again later") if edited else ("Superseded", "read again later")
        if edited and self.stale_newest:
            return ("Stale", "edited after this read")
        return None


def _steps(view: View) -> tuple[Sequence[Step], bool]:
    """The view's steps (those from the previous request's tail on suffice between points) and
    whether the agent acts in text."""
    if not view.compacting:
        recent = recent_steps(view.messages)
        if recent is not None:
            return recent, False
    conversation = view.conversation()
    return conversation.steps, conversation.text_actions


def _failed(view: View, index: int) -> bool:
    """Whether the output at view ``index`` failed, read from the client's text (the view may
    already hold a placeholder for it)."""
    source = view.origin[index]
    text = message_text(view.original[source] if source >= 0 else view.messages[index])
    return failed(text)


def _target(output: Output) -> str:
    """What the ledger groups notes by: the file a read shows, or the command (clipped)."""
    target = output.key[1] if output.key is not None else output.action.tool
    return target if len(target) <= _TARGET_CHARS else target[: _TARGET_CHARS - 3] + "..."


def _part(output: Output) -> str:
    """The part of the file a read showed (its range arguments, or the shell command that
    showed it), when not the whole file read by a tool; "" for a command's output."""
    action = output.action
    if output.key is None or output.key[0] == "run":
        return ""
    if action.kind == SHELL:
        return f"via `{' '.join((action.command or '').split())[:_TARGET_CHARS]}`"
    scope = {k: v for k, v in action.args.items() if k not in _NOT_SCOPE}
    return ", ".join(f"{k}={orjson.dumps(v).decode()}" for k, v in sorted(scope.items()))


def _size(output: Output, text: str) -> str:
    """The part of the file shown (if not all of it), lines, size, and the exit code reported."""
    lines = text.count("\n") + 1
    size = f"{len(text)} chars" if len(text) < 1000 else f"{len(text) / 1000:.1f} KB"
    code = exit_code(text)
    part = _part(output)
    return (
        (f"{part}, " if part else "")
        + f"{lines} lines, {size}"
        + (f", exit {code}" if code is not None else "")
    )
