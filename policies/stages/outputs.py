"""What the improved stages need to know about tool outputs: which messages are outputs,
what produced them, whether they failed, and a one-line description of each."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import re2

from policies.actions import EDIT, READ, WRITE, Action
from policies.conversation import Conversation, Message, message_text, role, tool_call_ids
from policies.message_actions import actions_of, call_action
from policies.shell_commands import exit_code

_FAILURE_MARKERS = (
    "Traceback (most recent call last)",
    "No replacement was performed",
    "command not found",
    "No such file or directory",
    "did not appear verbatim",
    "SyntaxError:",
    "Invalid `path` parameter",
    "ERROR:",
)
# One pass over an output for all of them (RE2 matches an alternation of literals as a DFA):
# eight substring searches read each new output eight times at every compaction point.
_FAILURE_SEARCH = re2.compile("|".join(re2.escape(marker) for marker in _FAILURE_MARKERS))


def output_indices(conversation: Conversation) -> list[int]:
    """Messages that carry tool output: tool results, and text-agent observations."""
    messages = conversation.messages
    indices: list[int] = []
    for step in conversation.steps:
        if step.kind == "exchange":
            indices.extend(i for i in range(step.start, step.end) if role(messages[i]) == "tool")
        elif step.kind == "observation":
            indices.append(step.end - 1)
    return indices


def calls_by_id(messages: Sequence[Message]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for message in messages:
        if tool_call_ids(message):
            for call in message.get("tool_calls") or []:
                if isinstance(call, dict) and isinstance(call.get("id"), str):
                    found[call["id"]] = call
    return found


def _target(action: Action) -> str:
    """The action's target, with an editor's sub-command (``view /a.py``, ``str_replace /a.py``)
    so that a failed view and the edit that follows are different actions."""
    sub = action.args.get("command")
    if action.kind in (READ, EDIT, WRITE) and isinstance(sub, str) and action.path and sub != action.path:
        return f"{sub} {action.path}"
    return action.target or str(action.args)[:120]


def output_action(messages: Sequence[Message], index: int, calls: dict[str, dict[str, Any]]) -> Action | None:
    """The action whose output is ``messages[index]``, read through the shared action
    vocabulary: a tool result's call, or a text agent's last action before its observation
    (None: no call answers it, or no action is written in the message before it)."""
    message = messages[index]
    if role(message) == "tool":
        call = calls.get(str(message.get("tool_call_id")))
        return call_action(call) if call is not None else None
    found = actions_of(messages[index - 1]) if index > 0 else []
    return found[-1] if found else None


def action_of(messages: Sequence[Message], index: int, calls: dict[str, dict[str, Any]]) -> tuple[str, str]:
    """(tool name, its normalized target) of the action whose output is ``messages[index]``,
    read through the shared action vocabulary."""
    message = messages[index]
    action = output_action(messages, index, calls)
    if role(message) == "tool":
        name = (action.tool if action else "") or str(message.get("name") or "tool")
        if action is None:
            return name, ""
        return name, _target(action)
    if action is not None:
        return action.tool, _target(action)
    previous = messages[index - 1] if index > 0 else {}
    first_line = next(
        (line.strip() for line in message_text(previous).splitlines()[::-1] if line.strip()), ""
    )
    return "action", first_line


# Every compaction point asks again about each output of the history (a retry chain can span
# all of it), and an output's text is the same object from request to request (a body is
# read from where it stops repeating the last one), so its hash is computed once. A pure
# function's memo, bounded: no state a request could tell apart.
@functools.lru_cache(maxsize=8192)
def failed(text: str) -> bool:
    code = exit_code(text)
    if code is not None:
        return code != 0
    return _FAILURE_SEARCH.search(text) is not None


def _clip(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def describe(name: str, target: str, text: str) -> str:
    """tool, a digest of its arguments, size, exit code, first and last line."""
    lines = text.splitlines()
    # The first and the last non-blank lines, found from each end (not every line stripped).
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    last = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].strip()), None)
    code = exit_code(text)
    parts = [
        f"{name} {_clip(target, 80)!r}",
        f"{len(lines)} lines, {len(text)} chars",
    ]
    if code is not None:
        parts.append(f"exit {code}")
    if first is not None and last is not None:
        parts.append(f"first: {_clip(lines[first], 100)!r}")
        if last > first:
            parts.append(f"last: {_clip(lines[last], 100)!r}")
    return " | ".join(parts)
