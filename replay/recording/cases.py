"""Benchmark cases from recorded rows, made protocol-clean (every call answered, no orphan result).

A case is the recorded conversation made protocol-clean: null padding removed from messages
and tool schemas, tool-call arguments checked to be JSON objects, the final unanswered
``finish``/``submit`` action dropped, and a trailing assistant call with missing results
removed together with the results of its other calls. A case that still holds an unmatched
call or result is rejected, and the reason is counted.

The messages keep the wire shape (``arguments`` stay JSON strings) because cases are replayed
as HTTP requests; ``actions`` gives the parsed arguments.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from policies.actions import Action
from policies.conversation import Message, message_text, parse, role, tool_call_ids
from policies.message_actions import actions_of
from replay.recording.rows import row_messages, row_tools

# Actions that end a run: their call never gets a result.
FINISH_ACTIONS = frozenset({"finish", "submit", "task_complete", "attempt_completion"})
_TEXT_SUBMIT = re.compile(r"```\s*\n?\s*submit\s*\n?```\s*$|<function=(?:submit|finish)>", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Case:
    case_id: str
    instance_id: str
    repo: str
    source: str
    row_number: int
    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...]
    model_patch: str | None
    resolved: bool | None
    # Indices of the assistant messages the agent produced: each is one replayed request
    # (the history before it) answered with that message.
    steps: tuple[int, ...]
    text_actions: bool
    dropped: tuple[str, ...] = field(default=())  # what case building removed, for the report

    @property
    def system_prompt(self) -> str:
        return "\n".join(message_text(m) for m in self.messages if role(m) in ("system", "developer"))

    def actions(self, index: int) -> list[Action]:
        """The actions of the assistant message at ``index`` (the shared vocabulary)."""
        return actions_of(self.messages[index])


@dataclass(frozen=True, slots=True)
class Rejected:
    row_number: int
    instance_id: str
    reason: str
    detail: str = ""


def case_id_of(row: dict[str, Any], row_number: int) -> str:
    """Stable and unique per row: the task id plus a short hash of the recorded run."""
    instance = str(row.get("instance_id") or f"row{row_number}")
    digest = hashlib.blake2b(
        orjson.dumps([row.get("trajectory_id"), row.get("source"), row_number, instance]), digest_size=4
    ).hexdigest()
    return f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', instance)[:80]}-{digest}"


def _bad_arguments(messages: Sequence[Message]) -> str | None:
    for index, message in enumerate(messages):
        calls = message.get("tool_calls")
        if not isinstance(calls, list):
            continue
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                return f"message {index}: tool call without a function name"
            raw = function.get("arguments")
            if raw in (None, ""):
                continue
            try:
                parsed = orjson.loads(raw) if isinstance(raw, str) else raw
            except orjson.JSONDecodeError:
                return f"message {index}: arguments are not JSON"
            if not isinstance(parsed, dict):
                return f"message {index}: arguments are not a JSON object"
    return None


def _call_names(message: Message) -> list[str]:
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return []
    return [str(call.get("function", {}).get("name", "")) if isinstance(call, dict) else "" for call in calls]


def _drop_trailing(messages: list[Message], text_actions: bool) -> list[str]:
    """Remove the unanswered end of a run; returns what was removed."""
    dropped: list[str] = []
    if not messages:
        return dropped
    # The final finish call: native (a tool call nobody answers) or written as text.
    last = messages[-1]
    if role(last) == "assistant":
        names = _call_names(last)
        if names and all(name in FINISH_ACTIONS for name in names):
            text = message_text(last).strip()
            if text:
                messages[-1] = {k: v for k, v in last.items() if k != "tool_calls"}
            else:
                messages.pop()
            dropped.append("final finish call")
        elif not names and text_actions and _TEXT_SUBMIT.search(message_text(last)):
            messages.pop()
            dropped.append("final submit action")
    # A trailing assistant call whose results are (partly) missing: it goes, with the results
    # of its other calls.
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if role(message) == "tool":
            continue
        ids = tool_call_ids(message)
        if ids:
            answered = {m.get("tool_call_id") for m in messages[index + 1 :] if role(m) == "tool"}
            if not set(ids) <= answered:
                removed = len(messages) - index
                del messages[index:]
                dropped.append(f"trailing call without results ({removed} messages)")
        break
    return dropped


def build_case(row: dict[str, Any], row_number: int) -> Case | Rejected:
    instance = str(row.get("instance_id") or "")
    messages = row_messages(row)
    tools = row_tools(row)
    if not any(role(m) == "user" for m in messages):
        return Rejected(row_number, instance, "no user message")
    bad = _bad_arguments(messages)
    if bad:
        return Rejected(row_number, instance, "tool arguments not a JSON object", bad)
    text_actions = parse(messages).text_actions
    dropped = _drop_trailing(messages, text_actions)
    conversation = parse(messages)
    for problem in conversation.problems:
        reason = "unmatched tool call" if "without results" in problem else "unmatched tool result"
        return Rejected(row_number, instance, reason, problem)
    first_user = conversation.first_user
    steps = tuple(i for i, m in enumerate(messages) if role(m) == "assistant" and i > first_user >= 0)
    if not steps:
        return Rejected(row_number, instance, "no assistant step")
    return Case(
        case_id=case_id_of(row, row_number),
        instance_id=instance,
        repo=str(row.get("repo") or ""),
        source=str(row.get("source") or ""),
        row_number=row_number,
        messages=tuple(messages),
        tools=tuple(tools),
        model_patch=row.get("model_patch") if isinstance(row.get("model_patch"), str) else None,
        resolved=row.get("resolved") if isinstance(row.get("resolved"), bool) else None,
        steps=steps,
        text_actions=conversation.text_actions,
        dropped=tuple(dropped),
    )


def build_cases(rows: Iterable[dict[str, Any]]) -> Iterator[Case | Rejected]:
    for row_number, row in enumerate(rows):
        yield build_case(row, row_number)
