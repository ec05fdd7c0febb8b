"""Responses API items read into the neutral conversation, and a changed message written back
as items (``responses.py`` is the dialect; this module is its reading and writing of ``input``).

``instructions`` is a system message; ``input`` (a string, or items) becomes messages:

- ``message`` items are messages of their role (``input_text``/``output_text`` parts as text
  parts, images kept as image parts);
- a run of ``reasoning``, assistant ``message`` and call items (``function_call``,
  ``custom_tool_call`` such as Codex's ``apply_patch``, ``local_shell_call``) is one assistant
  turn with its tool calls, so the reasoning stays with the calls of its turn;
- ``item_reference`` items (a client with ``store: true``, such as the Vercel AI SDK, sends its
  earlier reasoning and text as references to what the server stored) belong to the turn they
  stand in: a reference to a reasoning item is only valid followed by the rest of its turn, so
  it is kept, summarized or dropped with that turn, never left behind. An output right after a
  turn whose call is hidden in a reference travels with that turn. References are counted
  (``item_references``); the tokens of what they stand for are unseen here;
- ``function_call_output``, ``custom_tool_call_output`` and ``local_shell_call_output`` are tool
  results (the protocol: every call keeps its output, and the policies never split a turn from
  its outputs);
- any other item (server-side ``compaction``, web or file search calls,
  ...) is kept as sent, in place, pinned: never summarized, offloaded or dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from policies.conversation import OPAQUE_ROLE, Message, message_text
from proxy.wire.json_body import json_text, json_value

CALLS = frozenset({"function_call", "custom_tool_call", "local_shell_call"})
_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output", "local_shell_call_output"})
OUTPUT_OF = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "local_shell_call": "local_shell_call_output",
}
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text", "refusal"})
_IMAGE_PARTS = frozenset({"input_image", "image"})
_TURN_ITEMS = frozenset({"reasoning", "item_reference"})
INSTRUCTIONS = -1  # the source of the neutral system message ``instructions`` became


@dataclass(frozen=True, slots=True)
class Sources:
    """For each neutral message, the input items it came from (``INSTRUCTIONS`` for the
    instructions); and whether ``input`` was a plain string."""

    items: tuple[tuple[int, ...], ...]
    input_string: bool


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _parts(content: Any) -> Any:
    """Message content as neutral (Chat Completions) parts."""
    if isinstance(content, str) or content is None:
        return content
    if not isinstance(content, list):
        return json_text(content)
    parts: list[Any] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind in _IMAGE_PARTS:
            parts.append({"type": "image_url", "image_url": {"url": part.get("image_url") or ""}})
        else:
            parts.append({"type": "text", "text": json_text(part)})
    return parts


def chat_call(item: dict[str, Any]) -> dict[str, Any]:
    """A call item as a neutral tool call (its arguments a JSON object, as the vocabulary reads)."""
    kind = item.get("type")
    if kind == "function_call":
        name, arguments = item.get("name"), item.get("arguments")
        arguments = arguments if isinstance(arguments, str) else json_text(arguments)
    elif kind == "custom_tool_call":
        name, arguments = item.get("name"), json_text({"input": item.get("input")})
    else:  # local_shell_call
        name, arguments = "local_shell", json_text(item.get("action") or {})
    return {
        "id": str(item.get("call_id") or item.get("id") or ""),
        "type": "function",
        "function": {"name": name if isinstance(name, str) else "", "arguments": arguments},
    }


def _output_text(item: dict[str, Any]) -> str:
    output = item.get("output")
    if isinstance(output, str):
        return output
    return text_of(output) or json_text(output)


def _is_turn_item(item: Any) -> bool:
    kind = item.get("type") if isinstance(item, dict) else None
    return kind in _TURN_ITEMS or kind in CALLS or (kind == "message" and item.get("role") == "assistant")


def _hidden_calls(turn: list[Any], items: list[Any], end: int, names: dict[str, str]) -> list[Message]:
    """Neutral calls for the outputs right after a turn with references whose own call is not
    in ``input`` (a referenced provider tool call): the output then travels with its turn."""
    if not any(i.get("type") == "item_reference" for i in turn):
        return []
    calls: list[Message] = []
    while end < len(items) and isinstance(items[end], dict) and items[end].get("type") in _OUTPUTS:
        call_id = items[end].get("call_id")
        if isinstance(call_id, str) and call_id and call_id not in names:
            calls.append(
                {"id": call_id, "type": "function", "function": {"name": "item_reference", "arguments": "{}"}}
            )
        end += 1
    return calls


def read_input(body: dict[str, Any]) -> tuple[list[Message], Sources]:
    """The neutral messages of a Responses request, and where each came from."""
    messages: list[Message] = []
    sources: list[tuple[int, ...]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
        sources.append((INSTRUCTIONS,))
    raw = body.get("input")
    if isinstance(raw, str):
        messages.append({"role": "user", "content": raw})
        sources.append((0,))
        return messages, Sources(tuple(sources), input_string=True)
    items: list[Any] = raw if isinstance(raw, list) else []
    names: dict[str, str] = {}  # call id -> tool name, for the results that answer them
    index = 0
    while index < len(items):
        item = items[index]
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if _is_turn_item(item):
            end = index
            while end < len(items) and _is_turn_item(items[end]):
                end += 1
            turn = items[index:end]
            text = "\n".join(text_of(i.get("content")) for i in turn if i.get("type") == "message")
            calls = [chat_call(i) for i in turn if i.get("type") in CALLS]
            names.update((c["id"], c["function"]["name"]) for c in calls)
            calls += _hidden_calls(turn, items, end, names)
            message: Message = {"role": "assistant", "content": text or None}
            if calls:
                message["tool_calls"] = calls
            messages.append(message)
            sources.append(tuple(range(index, end)))
            index = end
            continue
        if kind == "message" and isinstance(item.get("role"), str):
            messages.append({"role": item["role"], "content": _parts(item.get("content"))})
        elif kind in _OUTPUTS:
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": str(item.get("call_id") or ""),
                    # Named after its call, as chat agents name their results.
                    **({"name": names[item["call_id"]]} if item.get("call_id") in names else {}),
                    "content": _output_text(item),
                }
            )
        else:
            # Not understood here: kept as sent, counted on its JSON.
            messages.append({"role": OPAQUE_ROLE, "content": json_text(item)})
        sources.append((index,))
        index += 1
    return messages, Sources(tuple(sources), input_string=False)


def count_items(raw: Any, kind: str) -> int:
    if not isinstance(raw, list):
        return 0
    return sum(1 for i in raw if isinstance(i, dict) and i.get("type") == kind)


def message_item(role: str, text: str) -> dict[str, Any]:
    part = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": part, "text": text}]}


def changed_items(message: Message, originals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items of a message a policy changed (a placeholder, an excerpt, a note): the
    original items with the new text or arguments, ids and everything else as they were."""
    role = message.get("role")
    text = message.get("content")
    text = text if isinstance(text, str) else text_of(text)
    if role == "tool":
        return [{**item, "output": text} for item in originals]
    if role == "assistant":
        calls = {c.get("id"): c for c in message.get("tool_calls") or [] if isinstance(c, dict)}
        changed = []
        for item in originals:
            kind = item.get("type")
            call = calls.get(item.get("call_id"))
            if kind == "function_call" and call is not None:
                item = {**item, "arguments": call["function"]["arguments"]}
            elif kind == "custom_tool_call" and call is not None:
                arguments = json_value(call["function"]["arguments"])
                item = {**item, "input": arguments.get("input", item.get("input"))}
            elif kind == "message" and text is not None and text_of(item.get("content")) != text:
                item = {**item, "content": [{"type": "output_text", "text": text}]}
            changed.append(item)
        return changed
    (item,) = originals
    kind = "input_text" if role != "assistant" else "output_text"
    return [{**item, "content": [{"type": kind, "text": text}]}]


# --- A neutral history written as a Responses client would send it (the replay's requests) ---


def responses_tools(tools: Sequence[Any]) -> list[Any]:
    converted = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict):
            converted.append({"type": "function", **function})
        else:
            converted.append(tool)
    return converted


def output_items(message: Message) -> list[dict[str, Any]]:
    """An assistant message as Responses output items."""
    items: list[dict[str, Any]] = []
    text = message_text(message)
    if text or not message.get("tool_calls"):
        items.append(message_item("assistant", text))
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        function = (call.get("function") or {}) if isinstance(call, dict) else {}
        arguments = function.get("arguments")
        items.append(
            {
                "type": "function_call",
                "call_id": call.get("id"),
                "name": function.get("name"),
                "arguments": arguments if isinstance(arguments, str) else "{}",
            }
        )
    return items


def input_items(messages: Sequence[Message]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for message in messages:
        role = str(message.get("role"))
        if role == "assistant":
            items += output_items(message)
        elif role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message.get("tool_call_id"),
                    "output": message_text(message),
                }
            )
        else:
            items.append(message_item(role, message_text(message)))
    return items


def response_object(
    message: Message, model: Any, response_id: str, usage: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A Chat Completions answer's message as a Responses response object."""
    prompt = int((usage or {}).get("prompt_tokens") or 0)
    completion = int((usage or {}).get("completion_tokens") or 0)
    return {
        "id": response_id,
        "object": "response",
        "status": "completed",
        "model": model,
        "output": output_items(message),
        "usage": {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion},
    }
