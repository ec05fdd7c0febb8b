"""Which matches of a ``*`` search come first when not all fit: the pattern's terms, each
matching line's score, and the order (pure; ``search.py`` does the store reads).

A model looking for one fact (a server's pid, a commit, a seed) often writes the words it knows
as alternatives, ``pid|port|seed``, and the line it wants names several of them; the lines that
name one are noise, and the newest outputs are full of them. So the **terms** of a pattern are
the alternatives of its top-level ``|`` (a pattern that is one group, ``(?i)(pid|port)``, counts
by the group's alternatives; inline flags in front apply to every term); a pattern without
alternatives is one term, so all its matches tie on terms. Matches are ordered by the number of
distinct terms the line matches (all of them first), then the newest output first, then the
line's place in its output.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

import re2

# Inline flags at the front of a pattern, e.g. "(?i)": they apply to every term.
_FLAGS = re2.compile(r"^\(\?[imsU]+\)")
# Lines shown around a match when every match fits with its context.
CONTEXT = 2


@dataclass(frozen=True, slots=True)
class Hit:
    """One matching line of a saved output. ``age``: 0 is the newest output searched;
    ``line``: the 0-based line index; ``terms``: distinct terms of the pattern the line matches;
    ``context``: the lines around it, as (index, text), itself included."""

    handle: str
    age: int
    line: int
    text: str
    terms: int
    context: tuple[tuple[int, str], ...] = ()

    @property
    def rank(self) -> tuple[int, int, int]:
        return (-self.terms, self.age, self.line)


def _scan(pattern: str) -> tuple[list[str], list[int]]:
    """``pattern`` split at its top-level ``|`` (outside groups, classes and escapes), and the
    index of every top-level group's closing parenthesis."""
    parts: list[str] = []
    closes: list[int] = []
    depth, in_class, escaped, start = 0, False, False, 0
    for index, char in enumerate(pattern):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            escaped = pattern[index + 1 : index + 2] == "]"  # "[]...]": that "]" is a member
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                closes.append(index)
        elif char == "|" and depth == 0:
            parts.append(pattern[start:index])
            start = index + 1
    parts.append(pattern[start:])
    return parts, closes


def _one_group(pattern: str) -> str | None:
    """The inside of ``pattern`` when the whole pattern is one group, ``(...)``, ``(?:...)`` or
    ``(?P<name>...)``; else None."""
    _, closes = _scan(pattern)
    if not pattern.startswith("(") or closes[:1] != [len(pattern) - 1]:
        return None
    inner = pattern[1:-1]
    if inner.startswith("?:"):
        return inner[2:]
    if inner.startswith("?P<"):
        return inner[inner.find(">") + 1 :]
    return None if inner.startswith("?") else inner


def pattern_terms(pattern: str) -> list[str]:
    """The terms of ``pattern`` (see the module's docstring), each a pattern of its own."""
    flags_match = _FLAGS.match(pattern)
    flags = flags_match.group(0) if flags_match else ""
    body = pattern[len(flags) :]
    parts = _scan(body)[0]
    inner = _one_group(body) if len(parts) == 1 else None
    if inner is not None:
        parts = _scan(inner)[0]
    terms = [flags + part for part in dict.fromkeys(parts) if part]
    return terms if len(terms) > 1 else [pattern]


def compile_terms(terms: list[str]) -> list[Any]:
    """Each term compiled on its own; a term that does not compile alone is dropped (it then
    never adds to a line's score)."""
    options = re2.Options()
    options.log_errors = False
    compiled = []
    for term in terms:
        try:
            compiled.append(re2.compile(term, options))
        except re2.error:
            continue
    return compiled


def score(line: str, terms: list[Any]) -> int:
    """Distinct terms ``line`` matches (1 when the pattern has a single term)."""
    if len(terms) <= 1:
        return 1
    return sum(1 for term in terms if term.search(line) is not None)


def ordered(hits: list[Hit]) -> list[Hit]:
    """Best first: most terms matched, then the newest output, then the line's place."""
    return sorted(hits, key=lambda hit: hit.rank)


# Matching lines of one output scored before the rest are only counted (RE2 scans in linear time).
_SCORED_PER_OUTPUT = 2000


def clip(line: str, chars: int) -> str:
    """``line`` clipped at ``chars`` characters, saying how much was cut and how to see it."""
    if len(line) <= chars:
        return line
    return line[:chars] + f" [... line clipped: {len(line) - chars} more characters; search it with pattern]"


def scan_output(
    handle: str, age: int, content: str, regex: Any, terms: list[Any], *, keep: int, line_chars: int
) -> tuple[list[Hit], int, int]:
    """The ``keep`` best matching lines of one saved output (with their context), the number of
    its matching lines and of its lines. CPU-bound: callers run it in a worker thread."""
    starts = [0]
    position = content.find("\n")
    while position >= 0:
        starts.append(position + 1)
        position = content.find("\n", position + 1)
    total_lines = len(starts) - (1 if content.endswith("\n") else 0)

    def line(index: int) -> str:
        end = starts[index + 1] - 1 if index + 1 < len(starts) else len(content)
        return content[starts[index] : end].rstrip("\r")

    matched: list[int] = []
    for match in regex.finditer(content):
        index = bisect_right(starts, match.start()) - 1
        if not matched or matched[-1] != index:
            matched.append(index)
        if len(matched) > _SCORED_PER_OUTPUT:
            break
    hits = [Hit(handle, age, i, line(i), score(line(i), terms)) for i in matched[:_SCORED_PER_OUTPUT]]
    best = ordered(hits)[:keep]
    return (
        [
            Hit(
                h.handle,
                age,
                h.line,
                clip(h.text, line_chars),
                h.terms,
                tuple(
                    (i, clip(line(i), line_chars))
                    for i in range(max(0, h.line - CONTEXT), min(total_lines, h.line + CONTEXT + 1))
                ),
            )
            for h in best
        ],
        len(matched),
        total_lines,
    )
