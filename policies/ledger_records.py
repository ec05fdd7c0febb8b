"""Sections of the state ledger that keep what a summary must never paraphrase: the agent's
edits (by file, in order, each with the handle its content is saved under), the user's own
words after the task (verbatim, in order), with transcripts, the handles under which the
messages each summary replaced are saved verbatim (``policies/transcript.py``), oldest first,
and the outputs a later step made obsolete (``superseded_reads``), by file or command.

The user's words are kept verbatim as long as they fit ``USER_WORDS_CHARS`` (newest first: a
later correction overrides an earlier one); a message longer than ``LONG_USER_CHARS`` (about
1,500 tokens), or an older one past the budget, is shown by its head and the handle its whole
text is saved under, so nothing the user said is ever only paraphrased. How that section is
laid out (repeats once, older messages cut first) is ``ledger_user_words.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from policies.conversation import Message, message_text, role
from policies.handles import mention, superseded_of

LONG_USER_CHARS = 6000
USER_WORDS_CHARS = 12000
# Edits shown per file: the first ones and the newest ones (the count says how many in all).
EDITS_SHOWN_FIRST = 3
EDITS_SHOWN_LAST = 12
# Transcripts listed: the oldest ones and the newest ones (each transcript names the one
# before it, so the ones between stay reachable too).
TRANSCRIPTS_SHOWN_FIRST = 10
TRANSCRIPTS_SHOWN_LAST = 90


class RenderLimits(msgspec.Struct, frozen=True):
    """How much of each list a rendered ledger shows (the rest is counted, and the complete
    ledger is saved under a handle when any list is cut)."""

    items: int = 40
    handles: int = 100
    user_chars: int = USER_WORDS_CHARS
    edits_first: int = EDITS_SHOWN_FIRST
    edits_last: int = EDITS_SHOWN_LAST
    transcripts_first: int = TRANSCRIPTS_SHOWN_FIRST
    transcripts_last: int = TRANSCRIPTS_SHOWN_LAST


# Every item of every list (the complete ledger, saved under a handle when the shown one is cut).
UNBOUNDED = RenderLimits(10**9, 10**9, 10**12, 10**9, 10**9, 10**9, 10**9)
# From the complete ledger to the smallest: a ledger held to a token budget takes the first
# level that fits.
RENDER_LEVELS = (
    RenderLimits(),
    RenderLimits(20, 30, 6000, 2, 6, 3, 20),
    RenderLimits(10, 12, 3000, 1, 3, 1, 8),
    RenderLimits(5, 6, 1500, 1, 2, 1, 4),
    RenderLimits(2, 3, 600, 1, 1, 1, 2),
)


class EditRecord(msgspec.Struct, frozen=True):
    path: str
    label: str  # create, str_replace, Write, apply_patch, heredoc, shell...
    handle: str = ""  # "" when nothing was saved (a shell command listed under Commands)
    chars: int = 0


class TranscriptRecord(msgspec.Struct, frozen=True):
    """A transcript: client messages ``first``..``last`` (inclusive), saved under ``handle``."""

    handle: str
    first: int
    last: int
    messages: int
    steps: int
    chars: int


class SupersededRecord(msgspec.Struct, frozen=True):
    """An output a later step made obsolete: the file (or command), why, and its handle."""

    target: str
    why: str
    handle: str


class UserWords(msgspec.Struct, frozen=True):
    text: str
    # The view keeps this message verbatim right after the summary (the last user message).
    kept: bool = False


def size_text(chars: int) -> str:
    return f"{chars} chars" if chars < 1000 else f"{chars / 1000:.1f} KB"


def render_edits(edits: Sequence[EditRecord], path: str, limits: RenderLimits | None = None) -> str:
    """One file's edits in order: ``create 3.2 KB handle=out_..., str_replace 210 chars ...``."""
    limits = limits or RenderLimits()
    first, last = limits.edits_first, limits.edits_last
    mine = list(enumerate(e for e in edits if e.path == path))
    if len(mine) > first + last:
        mine = [*mine[:first], *mine[-last:]]
    parts: list[str] = []
    previous = -1
    for position, edit in mine:
        if position != previous + 1:
            parts.append(f"({position - previous - 1} more)")
        saved = f" {size_text(edit.chars)} {mention(edit.handle)}" if edit.handle else ""
        parts.append(f"{edit.label}{saved}")
        previous = position
    return ", ".join(parts)


def render_transcripts(records: Sequence[TranscriptRecord], limits: RenderLimits | None = None) -> list[str]:
    """The transcripts, oldest first, each by the client messages it holds and its handle."""
    if not records:
        return []
    limits = limits or RenderLimits()
    first, last = limits.transcripts_first, limits.transcripts_last
    lines = [
        "### Transcripts: the summarized messages, verbatim, oldest first (read_tool_output: "
        "pattern= to search, start_line/num_lines to page)"
    ]
    hidden = max(0, len(records) - first - last)
    for position, record in enumerate(records):
        if first <= position < first + hidden:
            if position == first:
                lines.append(f"- ... {hidden} more (each transcript names the one before it)")
            continue
        lines.append(f"- messages {record.first}-{record.last}: {mention(record.handle)}")
    return lines


def superseded_records(messages: Iterable[Message]) -> tuple[SupersededRecord, ...]:
    """The notes of superseded outputs among ``messages`` (what a summary replaces), in order:
    the notes themselves say which file or command, why, and the handle."""
    found = []
    for message in messages:
        if role(message) not in ("tool", "user"):
            continue
        note = superseded_of(message_text(message))
        if note is not None:
            handle, _status, why, target = note
            found.append(SupersededRecord(target, why, handle))
    return tuple(found)


def render_superseded(records: Sequence[SupersededRecord], budget: int) -> tuple[list[str], int]:
    """The newest ``budget`` superseded outputs, one line per file or command, by why, each
    why's handles in order after the count of its earlier ones not shown; and how many handles
    the lines name. The handles count against the saved outputs' limit, so the section costs
    what listing them as saved outputs did (the read tool's ``*`` searches every one anyway)."""
    shown = list(records)[-budget:] if budget > 0 else []
    if not shown:
        return [], 0
    total: dict[tuple[str, str], int] = {}
    for record in records:
        total[(record.target, record.why)] = total.get((record.target, record.why), 0) + 1
    by_target: dict[str, dict[str, list[str]]] = {}
    for record in shown:
        by_target.setdefault(record.target, {}).setdefault(record.why, []).append(mention(record.handle))
    lines = ["### Superseded outputs (a later step read the file or ran the command again; each saved)"]
    if len(shown) < len(records):
        lines.append(f"- ... {len(records) - len(shown)} earlier superseded outputs")
    for target, whys in by_target.items():
        parts = []
        for why, named in whys.items():
            earlier = total[(target, why)] - len(named)
            parts.append(f"{why}: {f'({earlier} earlier) ' if earlier else ''}{', '.join(named)}")
        lines.append(f"- `{target}`: {'; '.join(parts)}")
    return lines, len(shown)
