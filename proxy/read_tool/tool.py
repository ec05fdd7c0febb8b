"""``read_tool_output``: the tool the proxy injects so the model can read offloaded outputs.

It is added to a request's ``tools`` only when the view the upstream receives names a handle,
and it is answered inside the proxy, against the store, scoped to the caller's tenant. The
agent never sees the tool, its calls or its results.

A result is bounded three ways, so that no read round can overflow the model's window or the
proxy's memory: long lines are clipped (with a marker saying how to see the rest), a result
holds at most ``max_result_bytes`` bytes and at most the tokens its round has room for, and
whatever is left out is named with the ``start_line`` to continue from. Patterns run on RE2,
whose matching time is linear in the text (no catastrophic backtracking), in a worker thread.
"""

from __future__ import annotations

import functools
from bisect import bisect_right
from dataclasses import dataclass, replace
from typing import Any

import orjson
import re2

from policies.handles import normalize
from policies.tokens import TokenCounter

TOOL_NAME = "read_tool_output"
MAX_MATCHES = 50
CONTEXT_LINES = 2
MAX_PATTERN_CHARS = 500
DEFAULT_LINES = 200
# The handle that searches every saved output of the conversation (with a pattern).
SEARCH_ALL = "*"


# One object per setting, shared by every request (nothing edits a body in place): the token
# counter remembers a schema's count by the object, so a new copy per request was encoded and
# counted again, and each copy took a place among the client schemas the counter remembers.
@functools.lru_cache(maxsize=16)
def tool_schema(max_lines: int) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": (
                "Read a tool output that was saved outside the conversation. Placeholders and the summary "
                "name each saved output as handle=<id>. Returns numbered lines; use start_line/num_lines to "
                "page, or pattern (a regular expression, RE2 syntax) to find matching lines with context."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "handle": {
                        "type": "string",
                        "description": (
                            'The handle, e.g. out_0123456789abcdef; or "*" with a pattern to search every '
                            "saved output of this conversation at once."
                        ),
                    },
                    "start_line": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "First line to return or search from (1-based).",
                    },
                    "num_lines": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": max_lines,
                        "description": (
                            f"How many lines to return (default {DEFAULT_LINES}, at most {max_lines})."
                        ),
                    },
                    "pattern": {"type": "string", "description": "A regular expression to search for."},
                },
                "required": ["handle"],
            },
        },
    }


def is_internal(call: Any) -> bool:
    function = call.get("function") if isinstance(call, dict) else None
    return isinstance(function, dict) and function.get("name") == TOOL_NAME


@dataclass(frozen=True, slots=True)
class ReadLimits:
    max_lines: int = 1000
    max_line_chars: int = 2000
    max_result_bytes: int = 65_536
    max_result_tokens: int = 8_000


@dataclass(frozen=True, slots=True)
class ReadArguments:
    handle: str
    start_line: int = 1
    num_lines: int = DEFAULT_LINES
    pattern: str | None = None


class BadArguments(ValueError):
    """The call's arguments cannot be used; the message is the tool result."""


def parse_arguments(arguments: Any, max_lines: int) -> ReadArguments:
    try:
        args = orjson.loads(arguments) if isinstance(arguments, str | bytes) else arguments
    except orjson.JSONDecodeError:
        raise BadArguments("Error: the arguments are not valid JSON.") from None
    if not isinstance(args, dict) or not isinstance(args.get("handle"), str):
        raise BadArguments("Error: `handle` (a string) is required.")
    handle = normalize(args["handle"])
    pattern = args.get("pattern")
    if handle == SEARCH_ALL and not (isinstance(pattern, str) and pattern):
        raise BadArguments('Error: handle "*" searches every saved output: give a `pattern` too.')
    if isinstance(pattern, str) and len(pattern) > MAX_PATTERN_CHARS:
        raise BadArguments(f"Error: the pattern is longer than {MAX_PATTERN_CHARS} characters.")
    try:
        start = max(1, int(args.get("start_line") or 1))
        count = min(max_lines, max(1, int(args.get("num_lines") or DEFAULT_LINES)))
    except (TypeError, ValueError, OverflowError):
        if not (isinstance(pattern, str) and pattern):
            raise BadArguments("Error: start_line and num_lines must be integers.") from None
        start = 1  # a search ignores what it does not use, as before start_line applied to it
    if isinstance(pattern, str) and pattern:
        # With a pattern, start_line is where the search starts (to go on past the matches shown);
        # a search of every output ("*") has no lines of its own.
        return ReadArguments(handle, start_line=1 if handle == SEARCH_ALL else start, pattern=pattern)
    return ReadArguments(handle, start_line=start, num_lines=count)


def compile_pattern(pattern: str) -> Any:
    options = re2.Options()
    options.log_errors = False
    options.max_mem = 8 << 20  # RE2 falls back to a slower, bounded engine past this
    try:
        # Per line, as the model means it: ^ and $ match at line boundaries.
        return re2.compile("(?m)" + pattern, options)
    except re2.error as exc:
        detail = (
            exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else exc
        )
        raise BadArguments(
            f"Error: invalid regular expression ({detail}); patterns use RE2 syntax "
            "(no backreferences or lookaround)."
        ) from None


def _line_starts(text: str) -> list[int]:
    starts = [0]
    position = text.find("\n")
    while position >= 0:
        starts.append(position + 1)
        position = text.find("\n", position + 1)
    return starts


def _matching_lines(text: str, starts: list[int], pattern: str, first: int = 0) -> tuple[list[int], int]:
    """Indices of the first ``MAX_MATCHES`` lines with a match from line index ``first`` on, and
    the number of matching lines (counted up to a bound: RE2 scans the text once, in linear time)."""
    regex = compile_pattern(pattern)
    hits: list[int] = []
    total = 0
    last = -1
    for match in regex.finditer(text, starts[first] if first < len(starts) else len(text)):
        line = bisect_right(starts, match.start()) - 1
        if line != last:
            total += 1
            last = line
            if len(hits) < MAX_MATCHES:
                hits.append(line)
        if total > 100 * MAX_MATCHES:
            break
    return hits, total


def _line(text: str, starts: list[int], index: int) -> str:
    end = starts[index + 1] - 1 if index + 1 < len(starts) else len(text)
    return text[starts[index] : end].rstrip("\r")


@dataclass(frozen=True, slots=True)
class ReadResult:
    text: str
    outcome: str  # ok, not_found, expired, bad_arguments, store_error, truncated
    lines_returned: int = 0


def render(
    handle: str,
    content: str,
    args: ReadArguments,
    *,
    limits: ReadLimits,
    budget_tokens: int,
    counter: TokenCounter,
    encoding: str,
) -> ReadResult:
    """The text of a read of ``content``, held to the limits and to ``budget_tokens``.

    CPU-bound (pattern search, token counting): callers run it in a worker thread."""
    starts = _line_starts(content)
    total_lines = len(starts) - (1 if content.endswith("\n") else 0)
    if args.pattern is not None:
        hits, matching = _matching_lines(content, starts, args.pattern, args.start_line - 1)
        shown = sorted(
            {
                i
                for hit in hits
                for i in range(max(0, hit - CONTEXT_LINES), min(total_lines, hit + CONTEXT_LINES + 1))
            }
        )
        header = f"handle={handle}: {matching} matching line(s) of {total_lines}"
        if args.start_line > 1:
            header += f" from line {args.start_line} on"
        if matching > len(hits):
            header += f" (first {len(hits)} shown)"
    else:
        first = args.start_line - 1
        if first >= total_lines:
            return ReadResult(
                f"handle={handle}: start_line {args.start_line} is past the end ({total_lines} lines).", "ok"
            )
        shown = list(range(first, min(total_lines, first + args.num_lines)))
        header = f"handle={handle}: lines {shown[0] + 1}-{shown[-1] + 1} of {total_lines}"
    width = len(str(total_lines))
    limit = max(0, min(budget_tokens, limits.max_result_tokens))
    body, clipped = _fit(content, starts, shown, width, header, limit, limits, counter, encoding)
    notes: list[str] = []
    if args.pattern is not None and len(body) < len(shown):
        # The matches with their context do not fit: the matching lines alone (long ones
        # clipped shorter) say more than a cut-off context.
        tight = replace(limits, max_line_chars=min(limits.max_line_chars, _TIGHT_LINE_CHARS))
        alone, clipped_alone = _fit(content, starts, hits, width, header, limit, tight, counter, encoding)
        if len(alone) > sum(1 for line in body if _number(line) in hits):
            body, clipped, shown, limits = alone, clipped_alone, hits, tight
            notes.append("Matching lines only, without context, to fit the context window.")
    returned = len(body)
    if clipped:
        notes.append(f"{clipped} long line(s) clipped at {limits.max_line_chars} characters.")
    outcome = "ok"
    if returned < len(shown):
        outcome = "truncated"
        rest = rest_arguments(handle, args, shown[returned], shown[-1])
        if returned:
            notes.append(
                f"Output limited to what fits the context window: {returned} of {len(shown)} line(s) "
                f"returned; continue with start_line={shown[returned] + 1}: {rest}, or narrow it with "
                "pattern."
            )
        else:
            notes.append(
                "No room is left in the context window for this output now: go on with what you have, "
                f"or read it in a later answer: {rest} (fewer lines or a narrower pattern fit sooner)."
            )
    elif args.pattern is not None and matching > len(hits):
        outcome = "truncated"
        rest = rest_arguments(handle, args, hits[-1] + 1, total_lines - 1)
        notes.append(f"{matching - len(hits)} more matching line(s) past these: continue with {rest}.")
    text = "\n".join([header, *body, *(f"[{note}]" for note in notes)])
    return ReadResult(text, outcome, returned)


def rest_arguments(handle: str, args: ReadArguments, first: int, last: int) -> str:
    """The exact arguments that read lines ``first``..``last`` (0-based) of a read again: a page
    of them, or the same pattern searched from ``first`` on."""
    if args.pattern is not None:
        rest: dict[str, Any] = {"handle": handle, "pattern": args.pattern, "start_line": first + 1}
    else:
        rest = {"handle": handle, "start_line": first + 1, "num_lines": last - first + 1}
    return orjson.dumps(rest).decode()


# Tokens kept for the notes that follow the lines.
_NOTES_TOKENS = 80
# A matching line shown without context is clipped at this many characters.
_TIGHT_LINE_CHARS = 400


def _number(numbered: str) -> int:
    """The line index of a numbered result line (``  12| text`` -> 11)."""
    head = numbered.split("|", 1)[0].strip()
    return int(head) - 1 if head.isdigit() else -1


def _fit(
    content: str,
    starts: list[int],
    shown: list[int],
    width: int,
    header: str,
    limit: int,
    limits: ReadLimits,
    counter: TokenCounter,
    encoding: str,
) -> tuple[list[str], int]:
    """The numbered lines of ``shown`` that fit ``limit`` tokens and the byte limit, and how
    many were clipped. Lines are taken on a cheap upper bound (a token is at least one byte)
    and counted exactly only near the limit."""
    budget = limit - _NOTES_TOKENS
    used_bytes = len(header) + 1
    counted = counter.count_text(header, encoding)
    body: list[str] = []
    pending: list[str] = []  # taken, not counted exactly yet
    pending_bytes = 0
    clipped = 0
    for index in shown:
        line = _line(content, starts, index)
        if len(line) > limits.max_line_chars:
            extra = len(line) - limits.max_line_chars
            marker = f" [... line clipped: {extra} more characters; search it with pattern]"
            line = line[: limits.max_line_chars] + marker
            clipped += 1
        numbered = f"{index + 1:>{width}}| {line}"
        size = len(numbered.encode("utf-8", "replace")) + 1
        if used_bytes + size > limits.max_result_bytes:
            break
        if counted + pending_bytes + size <= budget:
            pending.append(numbered)
            pending_bytes += size
            used_bytes += size
            continue
        if pending:
            counted += counter.count_text("\n".join(pending), encoding) + 1
            body += pending
            pending, pending_bytes = [], 0
        cost = counter.count_text(numbered, encoding) + 1
        if counted + cost > budget:
            break
        body.append(numbered)
        counted += cost
        used_bytes += size
    body += pending
    # Counted piece by piece: check the whole once, and give back lines if the joins cost more.
    while body and counter.count_text("\n".join([header, *body]), encoding) > budget:
        body.pop()
    return body, clipped
