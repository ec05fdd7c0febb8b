"""The doors a replay goes through: a recorded run (Chat Completions messages) written as the
request of each wire format the proxy compacts, and the recorded upstream's answers written
back in that format.

A case's messages become, for ``responses``: ``instructions``-free ``input`` items (system and
user messages as ``message`` items, an assistant message as a ``message`` item and one
``function_call`` per tool call, tool results as ``function_call_output``), tools as flat
Responses function tools. The proxy reads those back into the same neutral conversation, so the
same policy makes the same decisions through either door (a test compares them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from policies.conversation import Message, message_text
from proxy.dialects.responses import neutral_tools, read_input

DIALECTS = ("chat", "responses")
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses"}


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


def request(dialect: str, model: str, messages: Sequence[Message], tools: Sequence[Any]) -> dict[str, Any]:
    """The request body a client of ``dialect`` sends for this history."""
    if dialect == "chat":
        body: dict[str, Any] = {"model": model, "messages": list(messages)}
        if tools:
            body["tools"] = list(tools)
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
    messages, _ = read_input(body)
    return messages


def tool_names(dialect: str, body: dict[str, Any]) -> tuple[str, ...]:
    raw = body.get("tools")
    tools: list[Any] = raw if isinstance(raw, list) else []
    if dialect == "chat":
        return tuple(str((t.get("function") or {}).get("name")) for t in tools if isinstance(t, dict))
    return tuple(str(t.get("name")) for t in tools if isinstance(t, dict))


def chat_request(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses request as a Chat Completions one (for an answering model that speaks chat)."""
    messages, _ = read_input(body)
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    if isinstance(body.get("tools"), list) and body["tools"]:
        chat["tools"] = neutral_tools(body["tools"])
    return chat


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
