"""A neutral (Chat Completions) history written as an Anthropic Messages client would send it,
and a chat answer as a Messages response: the replay's requests and its recorded upstream's
answers through the Messages door. Also which blocks of a Messages body carry a cache
breakpoint, for the replay's cost model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from policies.conversation import FIXED_ROLES, Message, message_text, system_prefix_end
from proxy.dialects.anthropic_messages import SYSTEM, Origin

# What a replayed Messages request asks for (the API requires ``max_tokens``): the policies'
# own answer reserve, so every door makes the same decisions.
ANTHROPIC_MAX_TOKENS = 1024


def anthropic_tools(tools: Sequence[Any]) -> list[Any]:
    converted = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict):
            schema = function.get("parameters") or {"type": "object", "properties": {}}
            converted.append(
                {
                    "name": function.get("name"),
                    "description": function.get("description", ""),
                    "input_schema": schema,
                }
            )
    return converted


def anthropic_content(message: Message) -> list[dict[str, Any]]:
    """An assistant message as Messages content blocks."""
    text = message_text(message)
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        function = (call.get("function") or {}) if isinstance(call, dict) else {}
        try:
            arguments = orjson.loads(function.get("arguments") or "{}")
        except orjson.JSONDecodeError:
            arguments = {}
        blocks.append(
            {
                "type": "tool_use",
                "id": call.get("id"),
                "name": function.get("name"),
                "input": arguments if isinstance(arguments, dict) else {},
            }
        )
    return blocks or [{"type": "text", "text": "(no output)"}]


def anthropic_body(messages: Sequence[Message]) -> tuple[str, list[dict[str, Any]]]:
    """``system`` and ``messages`` of a Messages request for a chat history: the leading system
    messages are ``system``; a later one stays in ``messages`` at its place, as Claude Code
    sends its environment block for a model name it does not know."""
    leading = system_prefix_end(messages)
    system = "\n\n".join(message_text(m) for m in messages[:leading])
    wire: list[dict[str, Any]] = []
    for message in messages[leading:]:
        role = message.get("role")
        if role == "assistant":
            wire.append({"role": "assistant", "content": anthropic_content(message)})
        elif role == "tool":
            block = {
                "type": "tool_result",
                "tool_use_id": message.get("tool_call_id"),
                "content": message_text(message),
            }
            previous = wire[-1] if wire else None
            if previous is not None and previous["role"] == "user" and previous.get("results"):
                previous["content"].append(block)
            else:
                wire.append({"role": "user", "content": [block], "results": True})
        elif role in FIXED_ROLES:
            wire.append({"role": "system", "content": message_text(message)})
        else:
            wire.append({"role": "user", "content": message_text(message)})
    for message in wire:
        message.pop("results", None)
    return system, wire


def anthropic_message(
    message: Message, model: Any, message_id: str, usage: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A Chat Completions answer's message as a Messages response."""
    content = anthropic_content(message)
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": int((usage or {}).get("prompt_tokens") or 0),
            "output_tokens": int((usage or {}).get("completion_tokens") or 0),
        },
    }


def _marked(block: Any) -> bool:
    return isinstance(block, dict) and block.get("cache_control") is not None


def breakpoint_blocks(body: dict[str, Any], origins: Sequence[Origin]) -> list[int]:
    """The blocks (0: the tools, 1 + i: neutral message i) of a Messages body that carry a
    ``cache_control`` breakpoint; a top-level one (automatic caching) marks the last block."""
    marks: list[int] = []
    if any(_marked(tool) for tool in body.get("tools") or []):
        marks.append(0)
    system = body.get("system")
    if isinstance(system, list) and any(_marked(b) for b in system):
        marks += [1 + i for i, o in enumerate(origins) if o.message == SYSTEM][:1]
    wire = body.get("messages")
    for index, message in enumerate(wire if isinstance(wire, list) else []):
        content = message.get("content") if isinstance(message, dict) else None
        for position, block in enumerate(content if isinstance(content, list) else []):
            inner = block.get("content") if isinstance(block, dict) else None
            if not (_marked(block) or (isinstance(inner, list) and any(_marked(b) for b in inner))):
                continue
            owners = [i for i, o in enumerate(origins) if o.message == index]
            exact = [i for i in owners if position in origins[i].blocks]
            if exact or owners:
                marks.append(1 + (exact or owners)[-1])
    if body.get("cache_control") is not None:
        marks.append(len(origins))
    return marks


def anthropic_request(model: str, messages: Sequence[Message], tools: Sequence[Any]) -> dict[str, Any]:
    system, wire = anthropic_body(messages)
    body: dict[str, Any] = {"model": model, "max_tokens": ANTHROPIC_MAX_TOKENS, "messages": wire}
    if system:
        body["system"] = system
    if tools:
        body["tools"] = anthropic_tools(tools)
    return body
