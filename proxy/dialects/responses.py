"""The Responses API (``POST /v1/responses``): items read into the neutral conversation
(``responses_items.py``), and a view written back with every untouched item exactly as it came.

Requests with ``previous_response_id`` or ``conversation`` continue a history the proxy cannot
see: they go upstream as sent (``x-compaction-skipped`` says so). ``read_tool_output`` is a
Responses function tool; a round's reasoning items and read calls go back with their outputs.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import orjson

from policies.conversation import OPAQUE_ROLE, Message
from policies.tokens import TokenCounter
from proxy.dialects.base import NOT_RUN, Answer, BaseDialect, Parsed
from proxy.dialects.responses_compaction import RemoteCompaction
from proxy.dialects.responses_items import (
    CALLS,
    INSTRUCTIONS,
    OUTPUT_OF,
    Sources,
    changed_items,
    chat_call,
    count_items,
    input_items,
    message_item,
    read_input,
    response_object,
    responses_tools,
    text_of,
)
from proxy.dialects.responses_stream import ResponsesStream, error_event
from proxy.read_tool.tool import TOOL_NAME, tool_schema
from proxy.telemetry.shadow import FINAL_ANSWER, decision_signature
from proxy.wire.errors import ProxyError
from proxy.wire.response_writer import ResponseWriter


class ResponsesDialect(BaseDialect):
    name = "responses"
    prompt_key = "input_tokens"
    output_key = "output_tokens"
    cached_path = ("input_tokens_details", "cached_tokens")
    tool_call_marker = b'"function_call"'
    max_tokens_key = "max_output_tokens"
    history_field = "input"
    remote_compaction: RemoteCompaction | None = RemoteCompaction()

    def parse(self, body: Any, known: int = 0) -> Parsed:
        if not isinstance(body, dict):
            raise ProxyError(400, "The request body must be a JSON object.")
        raw = body.get("input")
        if raw is not None and not isinstance(raw, str | list):
            raise ProxyError(400, "'input' must be a string or an array of items.", param="input")
        messages, sources = read_input(body)
        notes: dict[str, Any] = {
            "items": 0 if sources.input_string else len(raw or []),
            "reasoning_items": count_items(raw, "reasoning"),
            "item_references": count_items(raw, "item_reference"),
            "kept_as_sent": sum(1 for m in messages if m.get("role") == OPAQUE_ROLE),
        }
        skipped = None
        for held in ("previous_response_id", "conversation"):
            if body.get(held):
                skipped = f"{held}: the history is held upstream"
        if raw is None and not skipped:
            skipped = "no input"
        neutral = {"model": body.get("model"), "messages": messages}
        if isinstance(body.get("tools"), list):
            neutral["tools"] = neutral_tools(body["tools"])
        if isinstance(body.get("max_output_tokens"), int):
            neutral["max_tokens"] = body["max_output_tokens"]
        return Parsed(
            body=body,
            neutral=neutral,
            stream=body.get("stream") is True,
            skipped=skipped,
            notes=notes,
            private=sources,
        )

    def render(self, parsed: Parsed, view: Sequence[Message], origin: Sequence[int]) -> dict[str, Any]:
        sources: Sources = parsed.private
        originals = parsed.neutral["messages"]
        raw = parsed.body.get("input")
        items: list[Any] = []
        body = dict(parsed.body)
        instructions_kept = False
        for message, source in zip(view, origin, strict=True):
            if source >= 0:
                where = sources.items[source]
                if where == (INSTRUCTIONS,):
                    instructions_kept = True
                    if message is not originals[source]:
                        body["instructions"] = text_of(message.get("content"))
                    continue
                if sources.input_string:
                    text = text_of(message.get("content"))
                    items.append(message_item("user", text))
                    continue
                from_input = [raw[i] for i in where] if isinstance(raw, list) else []
                items.extend(
                    from_input if message is originals[source] else changed_items(message, from_input)
                )
            else:
                role = message.get("role")
                text = text_of(message.get("content"))
                items.append(message_item(str(role), text))
        if not instructions_kept:
            body.pop("instructions", None)
        body["input"] = items
        return body

    def count(self, body: dict[str, Any], counter: TokenCounter) -> int:
        messages, _ = read_input(body)
        tools = body.get("tools")
        neutral = {"model": body.get("model"), "messages": messages, "tools": neutral_tools(tools or [])}
        return counter.count_request(neutral).total

    def with_read_tool(self, body: dict[str, Any], max_lines: int) -> dict[str, Any]:
        tools = body.get("tools")
        return {**body, "tools": [*(tools if isinstance(tools, list) else []), _read_tool(max_lines)]}

    def without_read_tool(self, body: dict[str, Any]) -> dict[str, Any]:
        tools = [
            t for t in body.get("tools") or [] if not (isinstance(t, dict) and t.get("name") == TOOL_NAME)
        ]
        if tools:
            return {**body, "tools": tools}
        return {k: v for k, v in body.items() if k not in ("tools", "tool_choice", "parallel_tool_calls")}

    def is_read_call(self, call: Any) -> bool:
        return (
            isinstance(call, dict) and call.get("type") == "function_call" and call.get("name") == TOOL_NAME
        )

    def call_arguments(self, call: Any) -> Any:
        return call.get("arguments") if isinstance(call, dict) else None

    def json_answer(self, data: Any) -> Answer | None:
        output = data.get("output") if isinstance(data, dict) else None
        if not isinstance(output, list):
            return None
        return answer_of(output, data.get("usage"))

    def add_round(
        self, body: dict[str, Any], answer: Answer, results: Sequence[tuple[Any, str]]
    ) -> dict[str, Any]:
        raw = body.get("input")
        items: list[Any] = [message_item("user", raw)] if isinstance(raw, str) else list(raw or [])
        answered = {id(call): text for call, text in results}
        # The round goes back whole (reasoning is only valid with the items that followed it);
        # the agent's calls of that answer are answered NOT_RUN, to be re-issued.
        round_items = [i for i in answer.items if isinstance(i, dict)]
        if not any(id(i) in answered for i in round_items):  # the answer's items are not known
            round_items = [call for call, _ in results]
        items += round_items
        calls = [i for i in round_items if i.get("type") in CALLS]
        # The calls not run first, the reads last: the round ends with what the model asked for.
        items += [
            {
                "type": OUTPUT_OF.get(str(i.get("type")), "function_call_output"),
                "call_id": i.get("call_id"),
                "output": answered.get(id(i), NOT_RUN),
            }
            for i in sorted(calls, key=lambda i: id(i) in answered)
        ]
        return {**body, "input": items}

    def final_json(self, data: dict[str, Any], total_usage: dict[str, int]) -> bytes:
        output = data.get("output") or []
        data["output"] = [i for i in output if not self.is_read_call(i)]
        if total_usage:
            data["usage"] = merge_usage(data.get("usage"), total_usage)
        return orjson.dumps(data)

    def codec(self, writer: ResponseWriter) -> ResponsesStream:
        return ResponsesStream(writer, self.is_read_call)

    def error_event(self, error: ProxyError) -> bytes:
        return error_event(error)

    def decision(self, raw: bytes, sse: bool) -> str:
        output = ResponsesStream.output_of(raw) if sse else _output_of_json(raw)
        for item in output:
            if isinstance(item, dict) and item.get("type") in CALLS:
                return decision_signature({"role": "assistant", "tool_calls": [chat_call(item)]})
        return FINAL_ANSWER

    def client_request(self, model: str, messages: Sequence[Message], tools: Sequence[Any]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "input": input_items(messages), "store": False}
        if tools:
            body["tools"] = responses_tools(tools)
        return body

    def answer_from_chat(
        self, message: Message, model: Any, answer_id: str, usage: dict[str, Any] | None
    ) -> dict[str, Any]:
        return response_object(message, model, "resp_" + answer_id, usage)


class ResponsesCompactDialect(ResponsesDialect):
    """``POST /v1/responses/compact``: a Responses body whose every request asks for a
    compaction (``route/compact_answer.py`` answers it, or relays it as sent)."""

    name = "responses_compact"
    remote_compaction: RemoteCompaction | None = RemoteCompaction(endpoint=True)


def neutral_tools(tools: Sequence[Any]) -> list[Any]:
    """Function tools as Chat Completions declares them (counted the same through either door);
    other tools (custom, built-in) as they are."""
    neutral = []
    for tool in tools:
        if isinstance(tool, dict) and tool.get("type") == "function" and "function" not in tool:
            function = {k: v for k, v in tool.items() if k != "type"}
            neutral.append({"type": "function", "function": function})
        else:
            neutral.append(tool)
    return neutral


def answer_of(output: list[Any], usage: Any) -> Answer:
    calls = [i for i in output if isinstance(i, dict) and i.get("type") in CALLS]
    text = "".join(
        text_of(i.get("content")) for i in output if isinstance(i, dict) and i.get("type") == "message"
    )
    return Answer(
        calls=calls, text=text or None, usage=usage if isinstance(usage, dict) else None, items=output
    )


def merge_usage(usage: Any, total: dict[str, int]) -> dict[str, Any]:
    return {**(usage if isinstance(usage, dict) else {}), **total}


def _output_of_json(raw: bytes) -> list[Any]:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return []
    output = data.get("output") if isinstance(data, dict) else None
    return output if isinstance(output, list) else []


@functools.lru_cache(maxsize=16)
def _read_tool(max_lines: int) -> dict[str, Any]:
    """The read tool in the Responses API's shape: one object per setting (``tool_schema``)."""
    return {"type": "function", **tool_schema(max_lines)["function"], "strict": False}
