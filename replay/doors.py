"""The doors a replay goes through: a recorded run (Chat Completions messages) written as the
request of each wire format the proxy compacts, and the recorded upstream's answers written
back in that format.

A case's messages become, for ``responses``: ``instructions``-free ``input`` items (system and
user messages as ``message`` items, an assistant message as a ``message`` item and one
``function_call`` per tool call, tool results as ``function_call_output``), tools as flat
Responses function tools. For ``anthropic`` (Messages): the system messages as ``system``, an
assistant message as ``text`` and ``tool_use`` blocks, the tool results of one assistant message
as ``tool_result`` blocks of the next user message, tools with ``input_schema``, and the
``max_tokens`` the API requires (1,024: the policies' own answer reserve, so the same
decisions). The proxy reads each back into the same neutral conversation, so the same policy
makes the same decisions through every door (a test compares them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from policies.conversation import Message, message_text
from proxy.dialects.anthropic import neutral_tools as anthropic_neutral_tools
from proxy.dialects.anthropic_messages import read_messages
from proxy.dialects.responses import neutral_tools
from proxy.dialects.responses_items import read_input

DIALECTS = ("chat", "responses", "anthropic")
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "anthropic": "/v1/messages"}
ANTHROPIC_MAX_TOKENS = 1024


def responses_tools(tools: Sequence[Any]) -> list[Any]:
    converted = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict):
            converted.append({"type": "function", **function})
        else:
            converted.append(tool)
    return converted


def _message_item(role: str, text: str) -> dict[str, Any]:
    part = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": part, "text": text}]}


def output_items(message: Message) -> list[dict[str, Any]]:
    """An assistant message as Responses output items."""
    items: list[dict[str, Any]] = []
    text = message_text(message)
    if text or not message.get("tool_calls"):
        items.append(_message_item("assistant", text))
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
            items.append(_message_item(role, message_text(message)))
    return items


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
    """``system`` and ``messages`` of a Messages request for a chat history."""
    system = "\n\n".join(message_text(m) for m in messages if m.get("role") == "system")
    wire: list[dict[str, Any]] = []
    for message in messages:
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
        elif role != "system":
            wire.append({"role": "user", "content": message_text(message)})
    for message in wire:
        message.pop("results", None)
    return system, wire


def request(dialect: str, model: str, messages: Sequence[Message], tools: Sequence[Any]) -> dict[str, Any]:
    """The request body a client of ``dialect`` sends for this history."""
    if dialect == "chat":
        body: dict[str, Any] = {"model": model, "messages": list(messages)}
        if tools:
            body["tools"] = list(tools)
        return body
    if dialect == "anthropic":
        system, wire = anthropic_body(messages)
        body = {"model": model, "max_tokens": ANTHROPIC_MAX_TOKENS, "messages": wire}
        if system:
            body["system"] = system
        if tools:
            body["tools"] = anthropic_tools(tools)
        return body
    body = {"model": model, "input": input_items(messages), "store": False}
    if tools:
        body["tools"] = responses_tools(tools)
    return body


def neutral_messages(dialect: str, body: dict[str, Any]) -> list[Message]:
    """The messages a received request holds, in the neutral (chat) form."""
    if dialect == "chat":
        messages = body.get("messages")
        return messages if isinstance(messages, list) else []
    if dialect == "anthropic":
        return read_messages(body).messages
    messages, _ = read_input(body)
    return messages


def tool_names(dialect: str, body: dict[str, Any]) -> tuple[str, ...]:
    raw = body.get("tools")
    tools: list[Any] = raw if isinstance(raw, list) else []
    if dialect == "chat":
        return tuple(str((t.get("function") or {}).get("name")) for t in tools if isinstance(t, dict))
    return tuple(str(t.get("name")) for t in tools if isinstance(t, dict))


def chat_request(dialect: str, body: dict[str, Any]) -> dict[str, Any]:
    """A Responses or Messages request as a Chat Completions one (for an answering model that
    speaks chat)."""
    messages = neutral_messages(dialect, body)
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    if isinstance(body.get("tools"), list) and body["tools"]:
        convert = anthropic_neutral_tools if dialect == "anthropic" else neutral_tools
        chat["tools"] = [t for t in convert(body["tools"]) if isinstance(t, dict) and "function" in t]
    return chat


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
