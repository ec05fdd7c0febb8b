"""Chat Completions (``POST /v1/chat/completions``): the neutral conversation is this format's
own ``messages``, so reading and writing a view is direct, but for custom tool calls, read as
function calls and written back in their custom shape (``chat_custom.py``).

Streams are ``data: {chat.completion.chunk}`` events ending in ``data: [DONE]``; a failure
after the response started is an OpenAI-style ``data: {"error": ...}`` event, which the SDKs
raise as ``APIError``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import orjson

from policies.conversation import Message, shape_problem
from policies.pipeline import requested_answer_tokens
from policies.tokens import TokenCounter
from proxy.dialects.base import Answer, BaseDialect, Parsed
from proxy.dialects.chat_custom import neutral_body, neutral_messages, wire_messages
from proxy.dialects.chat_stream import ChatStream, chat_decision
from proxy.read_tool.tool import TOOL_NAME, tool_schema
from proxy.wire.errors import ProxyError
from proxy.wire.response_writer import ResponseWriter, chat_error_event


def is_read_call(call: Any) -> bool:
    function = call.get("function") if isinstance(call, dict) else None
    return isinstance(function, dict) and function.get("name") == TOOL_NAME


def _is_read_tool(tool: Any) -> bool:
    function = tool.get("function") if isinstance(tool, dict) else None
    return isinstance(function, dict) and function.get("name") == TOOL_NAME


class ChatDialect(BaseDialect):
    name = "chat"

    def parse(self, body: Any, known: int = 0) -> Parsed:
        if not isinstance(body, dict):
            raise ProxyError(400, "The request body must be a JSON object.")
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise ProxyError(400, "'messages' is a required property and must be an array.", param="messages")
        skipped = shape_problem(messages, start=known)
        # Custom tool calls are read as function calls (``chat_custom.py``); a history without
        # any is its own neutral conversation.
        converted = neutral_messages(messages)
        neutral = body if converted is None else {**body, "messages": converted}
        return Parsed(body=body, neutral=neutral, stream=body.get("stream") is True, skipped=skipped)

    def render(self, parsed: Parsed, view: Sequence[Message], origin: Sequence[int]) -> dict[str, Any]:
        if parsed.neutral is parsed.body:
            return {**parsed.body, "messages": list(view)}
        messages = wire_messages(view, origin, parsed.neutral["messages"], parsed.body["messages"])
        return {**parsed.body, "messages": messages}

    def answer_tokens(self, body: dict[str, Any]) -> int:
        return requested_answer_tokens(body)

    def count(self, body: dict[str, Any], counter: TokenCounter) -> int:
        return counter.count_request(neutral_body(body)).total  # custom inputs counted as read

    def with_read_tool(self, body: dict[str, Any], max_lines: int) -> dict[str, Any]:
        tools = body.get("tools")
        return {**body, "tools": [*(tools if isinstance(tools, list) else []), tool_schema(max_lines)]}

    def without_read_tool(self, body: dict[str, Any]) -> dict[str, Any]:
        """The read tool withdrawn (and the ``tools`` list with it when the client had none)."""
        tools = [t for t in body.get("tools") or [] if not _is_read_tool(t)]
        if tools:
            return {**body, "tools": tools}
        return {k: v for k, v in body.items() if k not in ("tools", "tool_choice", "parallel_tool_calls")}

    def is_read_call(self, call: Any) -> bool:
        return is_read_call(call)

    def call_arguments(self, call: Any) -> Any:
        function = call.get("function") if isinstance(call, dict) else None
        return function.get("arguments") if isinstance(function, dict) else None

    def json_answer(self, data: Any) -> Answer | None:
        choice = data["choices"][0] if isinstance(data, dict) and data.get("choices") else None
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            return None
        calls = message.get("tool_calls")
        content = message.get("content")
        return Answer(
            calls=calls if isinstance(calls, list) else [],
            text=content if isinstance(content, str) else None,
            usage=data.get("usage") if isinstance(data.get("usage"), dict) else None,
        )

    def add_round(
        self, body: dict[str, Any], answer: Answer, results: Sequence[tuple[Any, str]]
    ) -> dict[str, Any]:
        calls = [call for call, _ in results]
        assistant = {"role": "assistant", "content": answer.text or None, "tool_calls": calls}
        tool_results = [
            {"role": "tool", "tool_call_id": call.get("id"), "content": text} for call, text in results
        ]
        return {**body, "messages": [*body["messages"], assistant, *tool_results]}

    def final_json(self, data: dict[str, Any], total_usage: dict[str, int]) -> bytes:
        choice = data["choices"][0]
        message = choice["message"]
        calls = message.get("tool_calls") if isinstance(message.get("tool_calls"), list) else []
        agent = [c for c in calls if not is_read_call(c)]
        if len(agent) != len(calls):  # the round limit: never hand the agent an internal call
            if agent:
                message["tool_calls"] = agent
            else:
                message.pop("tool_calls", None)
                choice["finish_reason"] = "stop"
        if total_usage:
            data["usage"] = {**(data.get("usage") or {}), **total_usage}
        return orjson.dumps(data)

    def codec(self, writer: ResponseWriter) -> ChatStream:
        return ChatStream(writer)

    def error_event(self, error: ProxyError) -> bytes:
        return chat_error_event(error)

    def decision(self, raw: bytes, sse: bool) -> str:
        return chat_decision(raw, sse)

    def client_request(self, model: str, messages: Sequence[Message], tools: Sequence[Any]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "messages": list(messages)}
        if tools:
            body["tools"] = list(tools)
        return body

    def answer_from_chat(
        self, message: Message, model: Any, answer_id: str, usage: dict[str, Any] | None
    ) -> dict[str, Any]:
        answer: dict[str, Any] = {
            "id": "chatcmpl-" + answer_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                }
            ],
        }
        if usage is not None:
            answer["usage"] = usage
        return answer
