"""The ledger's section of the user's own words after the task: verbatim, in order, and, when
they do not all fit the section's character budget, cut so that a later correction is never
shown less than the statement it corrects.

The rules, each for a reason:

- Repeats: a message identical to an earlier one (a harness nudge such as OpenHands' "Please
  continue working on the task...", sent again and again) is shown once, at its first
  position, and each later copy is a one-line reference (``[7] same as [3]``) in its own
  place, so the order is kept and the budget goes to what differs.
- Older cut first: when the section does not fit its budget, the oldest messages are cut
  first (a repeated message counts as new as its last copy), to an opening and the handle
  of the whole text, until it fits; the newest keep their whole text longest.
- Cutting must pay: a cut line costs its opening plus a marker (about 53 characters), so a
  message no longer than that is never cut.
- No newer message is shown less than an older one: a cut message's opening is at least as
  long as every older message shown whole (those not worth cutting, so at most an opening
  plus a marker longer than a head). A correction therefore always shows at least as much
  as the statement it corrects (an older message that fits no longer stays whole while a
  newer, longer one is cut to a head).
- A cut message is named with the handle its whole text is saved under (``read_tool_output``
  reads it back), so nothing the user said is ever only shortened.
- A message longer than ``LONG_USER_CHARS`` is a document (a pasted log or file): it is cut
  at every budget.

The layout depends only on the words and the budget, so the same ledger renders to the same
bytes (the prompt cache depends on it).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from policies.handles import mention, new_handle
from policies.ledger_records import LONG_USER_CHARS, USER_WORDS_CHARS, UserWords

HEADING = "### User instructions (verbatim, in order)"
# Said once, under the heading, when a message is shown by its opening.
CUT_NOTE = "(A cut or long message shows its opening: read_tool_output with its handle reads it whole.)"
# The opening of a cut message: longer while the section is roomy, short at the tight levels.
# A message no longer than its cut line (opening and marker) is never cut: at the tight levels
# about 170 characters, most instructions.
HEAD_CHARS = 300
TIGHT_HEAD_CHARS = 120
TIGHT_BUDGET = 3000
# What a kept message (shown whole right after the summary) shows here: enough to name it.
KEPT_CHARS = 120
WHOLE = -1


class Shown(msgspec.Struct, frozen=True):
    """How one entry is shown: the earlier identical entry it refers to (else -1), and the
    characters of its text shown (``WHOLE`` when verbatim)."""

    same_as: int = -1
    chars: int = WHOLE


def _head_chars(budget: int) -> int:
    return HEAD_CHARS if budget >= TIGHT_BUDGET else TIGHT_HEAD_CHARS


def _firsts(words: Sequence[UserWords]) -> tuple[list[int], dict[str, int]]:
    """For each entry, the position of the first entry with its text; and, per text, the
    position of its last copy (how new the text is)."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for position, entry in enumerate(words):
        first.setdefault(entry.text, position)
        last[entry.text] = position
    return [first[entry.text] for entry in words], last


def _marker(text: str) -> str:
    """What precedes a cut message's opening: why, its size and the handle of its whole text."""
    why = "long" if len(text) > LONG_USER_CHARS else "cut"
    return f"({why}, {len(text)} chars in all: {mention(new_handle(text))}) "


def _cuts(words: Sequence[UserWords], order: Sequence[int], budget: int, head: int) -> set[int]:
    """The entries (positions in ``order``, oldest first) shown cut: the documents, then the
    oldest worth cutting (longer than their cut line) until the section fits ``budget``."""
    cut = {p for p in order if len(words[p].text) > LONG_USER_CHARS}
    line = {p: head + len(_marker(words[p].text)) for p in order}
    total = sum(line[p] if p in cut else len(words[p].text) for p in order)
    for position in order:
        if total <= budget:
            break
        if position not in cut and len(words[position].text) > line[position]:
            cut.add(position)
            total -= len(words[position].text) - line[position]
    return cut


def user_words_layout(words: Sequence[UserWords], budget: int = USER_WORDS_CHARS) -> list[Shown]:
    """How each entry is shown within ``budget`` characters (the rules of this module)."""
    firsts, last = _firsts(words)
    head = _head_chars(budget)
    # The distinct texts not kept after the summary, the oldest (by their last copy) first.
    order = sorted((p for p in set(firsts) if not words[p].kept), key=lambda p: last[words[p].text])
    cut = _cuts(words, order, budget, head)
    chars: dict[int, int] = {}  # first position of a text -> characters shown (or WHOLE)
    widest = 0  # the longest message shown whole so far: no newer cut one shows less
    for position in order:
        size = len(words[position].text)
        opening = max(head, widest)
        if position in cut and opening < size:
            chars[position] = opening
        else:
            widest = max(widest, size)
    return [
        Shown(same_as=firsts[p] if firsts[p] != p else -1, chars=chars.get(firsts[p], WHOLE))
        for p in range(len(words))
    ]


def _flat(text: str, limit: int) -> str:
    """The text on one line, its first ``limit`` characters when longer (then "...")."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


def _repeats(layout: Sequence[Shown]) -> dict[int, str]:
    """For each entry repeated later, its note naming the later copies (one pass: a history of
    thousands of user turns is rendered in linear time)."""
    later: dict[int, list[str]] = {}
    for p, shown in enumerate(layout):
        if shown.same_as >= 0:
            later.setdefault(shown.same_as, []).append(f"[{p + 1}]")
    return {first: f"(repeated as {', '.join(copies)}) " for first, copies in later.items()}


def render_user_words(words: Sequence[UserWords], budget: int = USER_WORDS_CHARS) -> list[str]:
    if not words:
        return []
    layout = user_words_layout(words, budget)
    lines = [HEADING]
    if any(s.chars != WHOLE and not w.kept for w, s in zip(words, layout, strict=True)):
        lines.append(CUT_NOTE)
    notes = _repeats(layout)
    for position, (entry, shown) in enumerate(zip(words, layout, strict=True)):
        number = f"[{position + 1}]"
        if shown.same_as >= 0:
            lines.append(f"{number} same as [{shown.same_as + 1}]")
            continue
        repeats = notes.get(position, "")
        if entry.kept:
            kept = _flat(entry.text, KEPT_CHARS)
            lines.append(f"{number} (kept verbatim right after this summary) {repeats}{kept}")
        elif shown.chars == WHOLE:
            lines.append(f"{number} {repeats}{entry.text}")
        else:
            lines.append(f"{number} {_marker(entry.text)}{repeats}{_flat(entry.text, shown.chars)}")
    return lines


def saved_user_words(words: Sequence[UserWords], budget: int = USER_WORDS_CHARS) -> dict[str, str]:
    """Handle -> text of every entry the ledger shows cut (the proxy must store them)."""
    return {
        new_handle(entry.text): entry.text
        for entry, shown in zip(words, user_words_layout(words, budget), strict=True)
        if shown.same_as < 0 and shown.chars != WHOLE and not entry.kept
    }
