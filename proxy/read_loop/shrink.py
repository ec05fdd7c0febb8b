"""Earlier read results shortened, not withdrawn, to make room for an answer's reads (pure).

When a later answer's reads need room the window no longer has, the earlier results give it up
by **shrinking to a common level** (the largest first, none below ``SHRINK_FLOOR`` tokens): each
keeps its header and its first lines (a search's first lines are its best matches) and ends with
a note saying how many lines were cut and the exact arguments that read them again. A result
that cannot be cut by lines (an error, a single line) is left whole; withdrawing whole results
is the loop's last resort (``loop.py``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson

from proxy.read_tool.tool import SEARCH_ALL, BadArguments, parse_arguments

# A result is never shrunk below this many tokens: its header, a line or two, and the note.
SHRINK_FLOOR = 100
_CUT = "[Shortened to make room for later reads:"
# A page read's header: ``handle=out_1: lines 1-200 of 900``.
_PAGE = re.compile(r"^handle=\S+: lines \d+-(\d+) of \d+")


def _number(line: str) -> int | None:
    """The line number of a numbered result line (``  12| text`` -> 12), else None."""
    head, bar, _ = line.partition("| ")
    return int(head) if bar and head.strip().isdigit() else None


def water_level(sizes: list[int], deficit: int, floor: int = SHRINK_FLOOR) -> int:
    """The highest level (at least ``floor``) such that cutting every size above it down to it
    frees ``deficit`` tokens; ``floor`` when even that does not."""
    low, high = floor, max([floor, *sizes])
    if sum(max(0, s - low) for s in sizes) < deficit:
        return floor
    while low < high:
        middle = (low + high + 1) // 2
        if sum(max(0, s - middle) for s in sizes) >= deficit:
            low = middle
        else:
            high = middle - 1
    return low


def _note(arguments: Any, cut: list[str], planned_end: int = 0) -> str:
    """What was cut and the exact arguments that read it again."""
    numbers = [n for n in map(_number, cut) if n is not None]
    try:
        args = parse_arguments(arguments, 1_000_000)
    except BadArguments:
        return f"{_CUT} {len(numbers)} line(s) cut.]"
    if args.handle == SEARCH_ALL:
        handles = [line.split(":", 1)[0] for line in cut if line.startswith("handle=")]
        example = orjson.dumps({"handle": SEARCH_ALL, "pattern": args.pattern}).decode()
        where = f" (from {', '.join(dict.fromkeys(handles))})" if handles else ""
        return (
            f"{_CUT} {len(numbers)} matching line(s) cut{where}. The same search gives them again "
            f"(best first): {example}, or one output at a time with the same pattern.]"
        )
    first = numbers[0] if numbers else 1
    if args.pattern is not None:
        rest: dict[str, Any] = {"handle": args.handle, "pattern": args.pattern, "start_line": first}
        again = orjson.dumps(rest).decode()
        return f"{_CUT} {len(numbers)} line(s) cut, from line {first} on. Read them again: {again}]"
    # Up to the end of the page asked for (its header says it), which an earlier cut or the
    # room of the read itself may have left out too.
    last = max([*numbers, planned_end])
    rest = {"handle": args.handle, "start_line": first, "num_lines": last - first + 1}
    return f"{_CUT} lines {first}-{last} are not shown. Read them again: {orjson.dumps(rest).decode()}]"


def shrink(text: str, arguments: Any, tokens: int, count: Callable[[str], int]) -> str | None:
    """``text`` (a read result of ``arguments``) cut to its header and the most first lines that
    fit ``tokens`` with the note (always its first line); None when it has fewer than two
    numbered lines. Its own notes (about
    the read as it was) go with the cut."""
    lines = text.split("\n")
    numbered = [i for i, line in enumerate(lines) if _number(line) is not None]
    if len(numbered) < 2:
        return None  # cutting its only line would withdraw it: that is the loop's call
    # Everything after the last numbered line is the old result's notes.
    body = lines[: numbered[-1] + 1]
    page = _PAGE.match(lines[0])
    planned_end = int(page.group(1)) if page else 0

    def kept(index: int) -> str:
        """The result keeping ``index`` numbered lines (and what precedes the next one)."""
        end = numbered[index]
        while end > 1 and body[end - 1].startswith("handle="):
            end -= 1  # a search's section header goes with its lines
        return "\n".join([*body[:end], _note(arguments, body[end:], planned_end)])

    # At least one numbered line is kept (else it is a withdrawal) and at least one is cut.
    low, high = 1, len(numbered) - 1
    while low < high:
        middle = (low + high + 1) // 2
        if count(kept(middle)) <= tokens:
            low = middle
        else:
            high = middle - 1
    return kept(low)
