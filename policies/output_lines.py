"""The lines of a tool output the state ledger records: error lines and test summaries.

A line is an error line when it starts (after blanks) with an exception name, ``error``,
``fatal`` or ``FAILED`` followed by a colon or a blank; a test summary line holds a count such
as ``3 passed`` and one of the words passed, failed or error. Lines are ``str.splitlines``'s.

Every output a compaction point covers is read, and a regex tried at each position of a text
costs about 15 ns a character in Python's engine (70 us for a 4 KB output). So the text is
searched in ways that skip ahead at C speed: error lines by a pattern that starts with the
line break itself, summaries only around the words they must hold (found by ``str.find``) and
only when a digit is there at all. When the text has a line separator other than ``\\n``
(``\\r``, form feed, U+2028...), each line is tested as ``str.splitlines`` gives it, so the fast
paths and the rule itself never disagree.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

_NAMES = r"(?:[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)|error|fatal|FAILED)"
ERROR_LINE = re.compile(rf"^\s*{_NAMES}\b[:\s].*")
TEST_SUMMARY = re.compile(
    r"\b\d+ (?:passed|failed|errors?|skipped|xfailed|xpassed|deselected|warnings?)\b"
    r"(?:, \d+ \w+)*(?: in [\d.]+s)?"
)
# The error-line rule over a text whose only line separator is "\n": the blanks before the name
# and the one after it never cross a line break, and the match runs to the line's end. The
# first line is matched at 0; every other starts right after a "\n", which the engine finds fast.
_ERROR_FIRST_LINE = re.compile(rf"[^\S\n]*{_NAMES}\b(?::|[^\S\n]).*")
_ERROR_LATER_LINE = re.compile(rf"\n([^\S\n]*{_NAMES}\b(?::|[^\S\n]).*)")
# Every line separator of str.splitlines but "\n" ("\r\n" included, through "\r").
_OTHER_SEPARATORS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_LINE_WORDS = ("passed", "failed", "error")
# Each word a summary's count can precede: "3 passed" has " passed" after a decimal digit.
_COUNTED_WORDS = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "deselected", "warning")
_ASCII_DIGITS = "0123456789"


def _only_newlines(text: str) -> bool:
    return not any(separator in text for separator in _OTHER_SEPARATORS)


def error_lines(text: str) -> Iterator[str]:
    """The output's error lines, in order (whole lines, unstripped)."""
    if not _only_newlines(text):
        yield from (line for line in text.splitlines() if ERROR_LINE.match(line))
        return
    first = _ERROR_FIRST_LINE.match(text)
    if first:
        yield first.group(0)
    for match in _ERROR_LATER_LINE.finditer(text):
        yield match.group(1)


def summary_lines(text: str) -> Iterator[str]:
    """The output's test summary lines, in order (whole lines, unstripped)."""
    if text.isascii() and not any(digit in text for digit in _ASCII_DIGITS):
        return  # a summary holds a count
    if not _only_newlines(text):
        yield from (line for line in text.splitlines() if _is_summary(line))
        return
    starts = sorted({text.rfind("\n", 0, at) + 1 for at in _counted_word_positions(text)})
    for start in starts:
        end = text.find("\n", start)
        line = text[start:] if end < 0 else text[start:end]
        if _is_summary(line):
            yield line


def _is_summary(line: str) -> bool:
    return bool(TEST_SUMMARY.search(line)) and any(word in line for word in _LINE_WORDS)


def _counted_word_positions(text: str) -> Iterator[int]:
    """Where a counted word follows a blank and a decimal digit: every summary has one."""
    for word in _COUNTED_WORDS:
        at = text.find(word, 2)
        while at >= 0:
            if text[at - 1] == " " and text[at - 2].isdecimal():
                yield at
            at = text.find(word, at + 1)
