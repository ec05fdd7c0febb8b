"""``read_tool_output``: the tool the proxy injects so the model can read offloaded outputs.

It is added to a request's ``tools`` only when the view the upstream receives names a handle,
and it is answered inside the proxy, against the store, scoped to the caller's tenant. The
agent never sees the tool, its calls or its results.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from policies.conversation import Message, message_text
from proxy.store import Store

TOOL_NAME = "read_tool_output"
HANDLE_MARK = "handle=out_"
MAX_MATCHES = 50
CONTEXT_LINES = 2
MAX_PATTERN_CHARS = 500


def tool_schema(max_lines: int) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": (
                "Read a tool output that was saved outside the conversation. Placeholders and the summary "
                "name each saved output as handle=<id>. Returns numbered lines; use start_line/num_lines to "
                "page, or pattern (a regular expression) to find matching lines with context."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "handle": {"type": "string", "description": "The handle, e.g. out_0123456789abcdef."},
                    "start_line": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "First line to return (1-based).",
                    },
                    "num_lines": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": max_lines,
                        "description": f"How many lines to return (default 200, at most {max_lines}).",
                    },
                    "pattern": {"type": "string", "description": "A regular expression to search for."},
                },
                "required": ["handle"],
            },
        },
    }


def names_a_handle(messages: list[Message]) -> bool:
    return any(HANDLE_MARK in message_text(m) for m in messages)


def is_internal(call: Any) -> bool:
    function = call.get("function") if isinstance(call, dict) else None
    return isinstance(function, dict) and function.get("name") == TOOL_NAME


def _numbered(lines: list[str], indices: list[int]) -> str:
    width = len(str(len(lines)))
    return "\n".join(f"{i + 1:>{width}}| {lines[i]}" for i in indices)


async def run_read(store: Store, tenant: str, arguments: Any, max_lines: int) -> tuple[str, str]:
    """The tool result text and its outcome (``ok``, ``not_found``, ``expired``, ``bad_arguments``)."""
    try:
        args = orjson.loads(arguments) if isinstance(arguments, str) else arguments
    except orjson.JSONDecodeError:
        return "Error: the arguments are not valid JSON.", "bad_arguments"
    if not isinstance(args, dict) or not isinstance(args.get("handle"), str):
        return "Error: `handle` (a string) is required.", "bad_arguments"
    handle = args["handle"].strip().removeprefix("handle=")
    stored = await store.get_output(tenant, handle)
    if stored is None:
        return f"Error: no saved output with handle {handle!r} was found.", "not_found"
    if stored.content is None:
        return f"Error: the saved output {handle!r} has expired and can no longer be read.", "expired"
    lines = stored.content.splitlines()
    pattern = args.get("pattern")
    if isinstance(pattern, str) and pattern:
        if len(pattern) > MAX_PATTERN_CHARS:
            return "Error: the pattern is too long.", "bad_arguments"
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            return f"Error: invalid regular expression: {exc}.", "bad_arguments"
        hits = [i for i, line in enumerate(lines) if regex.search(line)]
        shown: list[int] = []
        for hit in hits[:MAX_MATCHES]:
            shown.extend(range(max(0, hit - CONTEXT_LINES), min(len(lines), hit + CONTEXT_LINES + 1)))
        shown = sorted(set(shown))
        header = f"handle={handle}: {len(hits)} matching line(s) of {len(lines)}"
        if len(hits) > MAX_MATCHES:
            header += f" (first {MAX_MATCHES} shown)"
        return header + "\n" + _numbered(lines, shown), "ok"
    try:
        start = max(1, int(args.get("start_line") or 1))
        count = min(max_lines, max(1, int(args.get("num_lines") or 200)))
    except (TypeError, ValueError):
        return "Error: start_line and num_lines must be integers.", "bad_arguments"
    indices = list(range(start - 1, min(len(lines), start - 1 + count)))
    if not indices:
        return f"handle={handle}: start_line {start} is past the end ({len(lines)} lines).", "ok"
    header = f"handle={handle}: lines {indices[0] + 1}-{indices[-1] + 1} of {len(lines)}"
    return header + "\n" + _numbered(lines, indices), "ok"
