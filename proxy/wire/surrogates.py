"""Lone UTF-16 surrogates in a body, and the marks that stand for them while the proxy works.

JSON (RFC 8259) allows a string to hold a lone surrogate escape (``"\\ud83d"``), and Node agents
send them: ``JSON.stringify`` writes one when a tool output cut by UTF-16 length ends inside an
emoji. Python reads one into a ``str`` that is not valid Unicode, which nothing downstream
accepts (orjson, re2, SQLite, msgspec, tokenizers refuse it). So while the proxy works on such a
body, each lone surrogate U+D800+k stands as the private-use character U+10F800+k (the last
2,048 code points of plane 16, which no font or agent uses): valid Unicode that every stage,
store, digest and counter takes as it is. Written upstream, each mark is the surrogate's
``\\uXXXX`` escape again (``unmark``), so the upstream reads what the client sent, and a saved
output read back with ``read_tool_output`` in that request reads back as it was saved.

Exactness: a body that already holds characters of the marks' range next to lone surrogates
cannot be marked without ambiguity, so it goes as sent (``Unmarkable``). A body with no lone
surrogate is never marked, and its text is never rewritten.

Counting: a mark counts as the tokenizer counts U+10F800+k (4 tokens in o200k and cl100k) where
the upstream, like tiktoken, reads a lone surrogate as one replacement character (1 token): a
body with lone surrogates is counted at most 3 tokens high for each, never low, so a view the
proxy counts as fitting the window fits.
"""

from __future__ import annotations

import re
from typing import Any

_FIRST_MARK = 0x10F800
_SURROGATE_BASE = 0xD800
# What a marked body must not hold already: lone surrogates are marked only where no mark is.
_LONE_OR_MARK = re.compile("[\ud800-\udfff\U0010f800-\U0010ffff]")
_MARK = re.compile("[\U0010f800-\U0010ffff]")
_LONE = re.compile("[\ud800-\udfff]")
# A surrogate's escape in a JSON text: a lone one is the only kind Python leaves in a str.
_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
# A mark in UTF-8: F4 8F, then 0xA0 + (k >> 6), then 0x80 + (k & 63).
_MARK_UTF8 = re.compile(rb"\xf4\x8f[\xa0-\xbf][\x80-\xbf]")


class Unmarkable(Exception):
    """A body with lone surrogates that already holds characters of the marks' range."""


def may_hold_lone_surrogates(body: bytes) -> bool:
    """Whether a JSON text has a surrogate escape at all (cheap: most lenient bodies have none)."""
    return _ESCAPE.search(body) is not None


def _mark_char(match: re.Match[str]) -> str:
    return chr(_FIRST_MARK + ord(match.group()) - _SURROGATE_BASE)


def _marked_str(text: str, found: list[bool]) -> str:
    if _LONE_OR_MARK.search(text) is None:
        return text
    if _MARK.search(text) is not None:
        found.append(False)
    if _LONE.search(text) is None:
        return text
    found.append(True)
    return _LONE.sub(_mark_char, text)


def _marked(value: Any, found: list[bool]) -> Any:
    if isinstance(value, str):
        return _marked_str(value, found)
    if isinstance(value, list):
        return [_marked(item, found) for item in value]
    if isinstance(value, dict):
        return {_marked_str(key, found): _marked(item, found) for key, item in value.items()}
    return value


def mark(data: Any) -> tuple[Any, bool]:
    """``data`` with every lone surrogate marked, and whether there was any (``data`` itself,
    untouched, when there was none). Raises ``Unmarkable``, and ``RecursionError`` on data
    nested past Python's limit."""
    found: list[bool] = []
    marked = _marked(data, found)
    if True not in found:
        return data, False
    if False in found:
        raise Unmarkable()
    return marked, True


def _escape(match: re.Match[bytes]) -> bytes:
    third, fourth = match.group()[2:]
    return b"\\u%04x" % (_SURROGATE_BASE + ((third - 0xA0) << 6) + (fourth - 0x80))


def unmark(text: bytes) -> bytes:
    """A JSON text written from marked data, each mark the lone surrogate's escape again (a
    mark stands only inside a string, where the escape means that surrogate)."""
    return _MARK_UTF8.sub(_escape, text)
