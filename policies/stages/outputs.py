"""What the improved stages need to know about tool outputs: which messages are outputs,
what produced them, whether they failed, and a one-line description of each."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import orjson

from policies.conversation import Conversation, Message, message_text, role, tool_call_ids

_EXIT_CODE = re.compile(r"(?:exit code|exit_code|exited with code)\D{0,3}(-?\d+)", re.IGNORECASE)
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


def _arguments(call: dict[str, Any]) -> dict[str, Any]:
    raw = (call.get("function") or {}).get("arguments")
    if isinstance(raw, str):
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return {"raw": raw}
        return parsed if isinstance(parsed, dict) else {"raw": raw}
    return raw if isinstance(raw, dict) else {}


def action_of(messages: Sequence[Message], index: int, calls: dict[str, dict[str, Any]]) -> tuple[str, str]:
    """(tool name, its main argument) of the action whose output is ``messages[index]``."""
    message = messages[index]
    if role(message) == "tool":
        call = calls.get(str(message.get("tool_call_id")), {})
        name = str((call.get("function") or {}).get("name") or message.get("name") or "tool")
        args = _arguments(call)
        target = args.get("command") if name not in ("str_replace_editor", "edit") else None
        target = target or " ".join(str(args[k]) for k in ("command", "path") if k in args) or str(args)[:120]
        return name, str(target)
    previous = messages[index - 1] if index > 0 else {}
    first_line = next(
        (line.strip() for line in message_text(previous).splitlines()[::-1] if line.strip()), ""
    )
    return "action", first_line


def exit_code(text: str) -> int | None:
    match = _EXIT_CODE.search(text[-400:])
    return int(match.group(1)) if match else None


def failed(text: str) -> bool:
    code = exit_code(text)
    if code is not None:
        return code != 0
    return any(marker in text for marker in _FAILURE_MARKERS)


def _clip(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def describe(name: str, target: str, text: str) -> str:
    """tool, a digest of its arguments, size, exit code, first and last line."""
    lines = [line for line in text.splitlines() if line.strip()]
    code = exit_code(text)
    parts = [
        f"{name} {_clip(target, 80)!r}",
        f"{len(text.splitlines())} lines, {len(text)} chars",
    ]
    if code is not None:
        parts.append(f"exit {code}")
    if lines:
        parts.append(f"first: {_clip(lines[0], 100)!r}")
        if len(lines) > 1:
            parts.append(f"last: {_clip(lines[-1], 100)!r}")
    return " | ".join(parts)
