"""What a step did, as superseded outputs see it: each action's output and key (the file a read
shows, the command a shell ran), the files it writes, and the steps a request between compaction
points needs (from the previous request's tail on).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from policies.actions import EDIT, PATCH, READ, SHELL, WRITE, Action
from policies.conversation import Message, Step, parse, result_id, role, tool_call_ids
from policies.message_actions import actions_of


@dataclass(frozen=True, slots=True)
class Output:
    """One action of a step: the view index of its output (None: not answered yet), the action,
    and its key (``("read", path)`` or ``("run", command)``; None: neither)."""

    index: int | None
    action: Action
    key: tuple[str, str] | None


def previous_tail(steps: Sequence[Step], newest: int) -> int:
    """Where the previous request's tail starts: its newest step with output, or its newest
    assistant turn, before the newest step with output (at ``newest``). What comes before it is
    what the provider's prompt cache holds."""
    kinds = ("exchange", "observation", "assistant")
    return next((s.start for s in reversed(steps) if s.start < newest and s.kind in kinds), newest)


def recent_steps(messages: Sequence[Message]) -> tuple[Step, ...] | None:
    """The steps from the previous request's tail on, found from the end: between points a
    request is the previous one plus a step, and parsing the whole history for its last steps
    would cost every request time in proportion to the session. In a conversation with tool
    calls every step that acts starts at an assistant message (results follow their calls, no
    message is an observation), so the newest exchange and the assistant message before it are
    step starts, and the messages from there on parse to the same steps alone. None (parse the
    whole history) without an exchange and an assistant message before it."""
    newest = next((i for i in range(len(messages) - 1, -1, -1) if tool_call_ids(messages[i])), None)
    if newest is None:
        return None
    tail = next((i for i in range(newest - 1, -1, -1) if role(messages[i]) == "assistant"), None)
    if tail is None:
        return None
    return tuple(
        Step(s.start + tail, s.end + tail, s.kind, s.call_ids, s.answered)
        for s in parse(messages[tail:]).steps
    )


def step_calls(messages: Sequence[Message], step: Step, text_actions: bool) -> list[Output]:
    """Each action of a step (its tool calls, or the action of an agent that acts in text) with
    the index of its output (None: not answered yet) and its key."""
    if step.kind == "exchange":
        assistant = messages[step.start]
        answered = {result_id(messages[i]): i for i in range(step.start + 1, step.end)}
        return [
            Output(answered.get(call_id), action, output_key(action))
            for call_id, action in zip(_call_ids(assistant), actions_of(assistant), strict=False)
        ]
    if step.kind == "observation" and text_actions:
        found = actions_of(messages[step.start])
        return [Output(step.end - 1, found[-1], output_key(found[-1]))] if found else []
    return []


def _call_ids(message: Message) -> list[str]:
    """The id of each call of an assistant message, in order ("" for a malformed call), so they
    pair with ``actions_of`` (one action per call)."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not tool_call_ids(message):
        return []
    return [str(c.get("id")) if isinstance(c, dict) else "" for c in calls]


def output_key(action: Action) -> tuple[str, str] | None:
    """``("read", path)`` for an action that shows a file (a shell command that reads one and
    writes none included), ``("run", command)`` for any other shell command, else None."""
    if action.kind == READ and action.path:
        return ("read", posixpath.normpath(action.path))
    if action.kind == SHELL and action.path and not action.paths:
        return ("read", posixpath.normpath(action.path))
    if action.kind == SHELL and action.command and action.command.strip():
        return ("run", " ".join(action.command.split()))
    return None


def written_paths(action: Action) -> Iterator[str]:
    """The files an action writes: an edit's or a write's path, a patch's paths, the files a
    shell command writes."""
    if action.kind in (EDIT, WRITE) and action.path:
        yield posixpath.normpath(action.path)
    elif action.kind == PATCH:
        for path in action.paths or ((action.path,) if action.path else ()):
            yield posixpath.normpath(path)
    elif action.kind == SHELL:
        yield from (posixpath.normpath(p) for p in action.paths)
