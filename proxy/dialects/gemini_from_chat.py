"""A Chat Completions history as a Gemini client sends it, and an answer as Gemini writes it
(the replay's doors, and tests that put a sample run through the Gemini door).

The leading system messages are ``systemInstruction``; a user message is a ``user`` content
with a text part (a later system message too: Gemini has no system role inside ``contents``);
an assistant message a ``model`` content with a text part and one ``functionCall`` part per
call (its ``id`` kept); the results of one assistant message one ``user`` content of
``functionResponse`` parts (``response: {"output": ...}``, as Gemini CLI sends them), named
after their call; tools one ``functionDeclarations`` list.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from policies.conversation import FIXED_ROLES, Message, message_text
from proxy.wire.json_body import json_value


def _leading_system(messages: Sequence[Message]) -> int:
    end = 0
    while end < len(messages) and messages[end].get("role") in FIXED_ROLES:
        end += 1
    return end


def model_parts(message: Message) -> list[dict[str, Any]]:
    text = message_text(message)
    parts: list[dict[str, Any]] = [{"text": text}] if text else []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        try:
            arguments = json_value(function.get("arguments") or "{}")
        except ValueError:
            arguments = {"arguments": function.get("arguments")}
        call_part: dict[str, Any] = {"name": function.get("name"), "args": arguments}
        if isinstance(call.get("id"), str):
            call_part["id"] = call["id"]
        parts.append({"functionCall": call_part})
    return parts


def gemini_request(model: str, messages: Sequence[Message], tools: Sequence[Any]) -> dict[str, Any]:
    """The body a Gemini client sends for this history (the model is in its path)."""
    leading = _leading_system(messages)
    contents: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for message in messages[leading:]:
        role = message.get("role")
        if role == "assistant":
            parts = model_parts(message)
            names.update(
                (str(p["functionCall"].get("id")), str(p["functionCall"]["name"]))
                for p in parts
                if "functionCall" in p
            )
            contents.append({"role": "model", "parts": parts or [{"text": ""}]})
        elif role == "tool":
            call_id = str(message.get("tool_call_id") or "")
            answer = {
                "id": call_id,
                "name": names.get(call_id, ""),
                "response": {"output": message_text(message)},
            }
            previous = contents[-1] if contents else None
            if previous is not None and previous.get("results"):
                previous["parts"].append({"functionResponse": answer})
            else:
                contents.append({"role": "user", "parts": [{"functionResponse": answer}], "results": True})
        else:
            contents.append({"role": "user", "parts": [{"text": message_text(message)}]})
    for content in contents:
        content.pop("results", None)
    body: dict[str, Any] = {"contents": contents}
    if leading:
        text = "\n\n".join(message_text(m) for m in messages[:leading])
        body["systemInstruction"] = {"parts": [{"text": text}]}
    declarations = [
        {
            "name": t["function"].get("name"),
            "description": t["function"].get("description", ""),
            "parameters": t["function"].get("parameters") or {"type": "object", "properties": {}},
        }
        for t in tools
        if isinstance(t, dict) and isinstance(t.get("function"), dict)
    ]
    if declarations:
        body["tools"] = [{"functionDeclarations": declarations}]
    return body


def gemini_response(
    message: Message, model: Any, response_id: str, usage: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A Chat Completions answer's message as a ``GenerateContentResponse``."""
    prompt = int((usage or {}).get("prompt_tokens") or 0)
    output = int((usage or {}).get("completion_tokens") or 0)
    return {
        "candidates": [
            {
                "content": {"role": "model", "parts": model_parts(message) or [{"text": ""}]},
                "finishReason": "STOP",
                "index": 0,
            }
        ],
        "usageMetadata": {
            "promptTokenCount": prompt,
            "candidatesTokenCount": output,
            "totalTokenCount": prompt + output,
        },
        "modelVersion": model,
        "responseId": response_id,
    }
