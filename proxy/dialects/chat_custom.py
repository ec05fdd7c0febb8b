"""Chat Completions custom tool calls (GPT-5's free-form tools, such as ``apply_patch``) read
into the neutral conversation, and written back.

A call ``{"id", "type": "custom", "custom": {"name", "input"}}`` is read as a function call
whose arguments are ``{"input": <input>}``, as the Responses door reads a ``custom_tool_call``:
the policies see an ``apply_patch`` call's patch as an edit (a large one is offloaded like a
function call's edit), summarize and record it like any call, and the ``tool`` result that
answers it keeps the protocol as any result does.

A view goes back with every message the policy left untouched exactly as the client sent it.
In a message it rewrote, each call that was a custom call takes its custom shape again: every
field as it came, the input the rewritten arguments' ``input``. The proxy's own
``read_tool_output`` stays a function tool.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from policies.conversation import Message
from proxy.wire.json_body import json_text, json_value

CUSTOM = "custom"


def is_custom_call(call: Any) -> bool:
    """A well-formed custom call: ``type`` custom, a ``custom`` object with a string name."""
    if not isinstance(call, dict) or call.get("type") != CUSTOM:
        return False
    custom = call.get("custom")
    return isinstance(custom, dict) and isinstance(custom.get("name"), str)


def _neutral_call(call: dict[str, Any]) -> dict[str, Any]:
    custom = call["custom"]
    text = custom.get("input")
    arguments = json_text({"input": text if isinstance(text, str) else ""})
    return {
        "id": call.get("id"),
        "type": "function",
        "function": {"name": custom["name"], "arguments": arguments},
    }


def neutral_message(message: Any) -> Any:
    """``message`` with its custom calls read as function calls (the same object without any)."""
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    if not isinstance(calls, list) or not any(is_custom_call(c) for c in calls):
        return message
    return {**message, "tool_calls": [_neutral_call(c) if is_custom_call(c) else c for c in calls]}


def neutral_messages(messages: Sequence[Any]) -> list[Any] | None:
    """The history with custom calls read as function calls; None when it has none (the
    neutral messages are then the body's own list). Every request scans its whole history:
    a message is only looked at further when one of its calls is typed custom."""
    converted: list[Any] | None = None
    for index, message in enumerate(messages):
        if type(message) is not dict or "tool_calls" not in message:
            continue
        calls = message["tool_calls"]
        if type(calls) is not list:
            continue
        for call in calls:
            if type(call) is dict and call.get("type") == CUSTOM:
                break
        else:
            continue
        neutral = neutral_message(message)
        if neutral is not message:
            if converted is None:
                converted = list(messages)
            converted[index] = neutral
    return converted


def neutral_body(body: dict[str, Any]) -> dict[str, Any]:
    """A wire body as the neutral request (the body itself when it has no custom call)."""
    messages = body.get("messages")
    converted = neutral_messages(messages) if isinstance(messages, list) else None
    return body if converted is None else {**body, "messages": converted}


def _customs_of(message: Any) -> dict[str, dict[str, Any]]:
    """The custom calls of a wire message, by id."""
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    if not isinstance(calls, list):
        return {}
    return {c["id"]: c for c in calls if is_custom_call(c) and isinstance(c.get("id"), str)}


def _input_of(call: dict[str, Any], original: dict[str, Any]) -> Any:
    """The input a rewritten call carries: its arguments' ``input`` (arguments a policy wrote
    as plain text are the input as they are)."""
    function = call.get("function")
    arguments = function.get("arguments") if isinstance(function, dict) else None
    if not isinstance(arguments, str):
        return original["custom"].get("input")
    try:
        value = json_value(arguments)
    except ValueError:
        return arguments
    text = value.get("input") if isinstance(value, dict) else None
    return text if isinstance(text, str) else arguments


def _custom_shaped(message: Message, *originals: dict[str, dict[str, Any]]) -> Message:
    """A rewritten message with each call that was a custom call in its custom shape again
    (the first of ``originals`` that knows the call's id says what it was)."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return message
    shaped, changed = [], False
    for call in calls:
        call_id = call.get("id") if isinstance(call, dict) else None
        known = (o[call_id] for o in originals if isinstance(call_id, str) and call_id in o)
        original = next(known, None)
        if original is not None and isinstance(call.get("function"), dict):
            call = {**original, "custom": {**original["custom"], "input": _input_of(call, original)}}
            changed = True
        shaped.append(call)
    return {**message, "tool_calls": shaped} if changed else message


def wire_messages(
    view: Sequence[Message], origin: Sequence[int], neutral: Sequence[Any], wire: Sequence[Any]
) -> list[Any]:
    """The view as the client's format: an untouched message (the very neutral object read from
    the client's message ``origin[i]``) as the client sent it; a rewritten one with its custom
    calls in their custom shape (the calls of the message it stands for first, then any of the
    request's custom calls with that id)."""
    everywhere: dict[str, dict[str, Any]] | None = None
    out: list[Any] = []
    for position, message in enumerate(view):
        source = origin[position] if position < len(origin) else -1
        if 0 <= source < len(neutral) and message is neutral[source]:
            out.append(wire[source])
            continue
        if not (isinstance(message, dict) and isinstance(message.get("tool_calls"), list)):
            out.append(message)
            continue
        if everywhere is None:
            everywhere = {}
            for each in wire:
                everywhere.update(_customs_of(each))
        own = _customs_of(wire[source]) if 0 <= source < len(wire) else {}
        out.append(_custom_shaped(message, own, everywhere))
    return out
