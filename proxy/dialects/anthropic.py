"""Anthropic Messages (``POST /v1/messages``): Claude Code and the Anthropic SDKs.

The history is read into the neutral conversation and a view written back by
``anthropic_messages`` (thinking and server tool blocks stay with their turn, signatures and
``cache_control`` untouched). This adapter adds the rest of the format:

- **prompt caching**: the end of the compacted prefix (the summary's block, else the last
  block a policy wrote, such as a placeholder) carries a ``cache_control`` breakpoint, so the
  prefix is cached and read back on the next requests (which send it byte for byte until the
  next compaction point); the API allows 4 breakpoints, so when the client's own and ours
  exceed that, the client's earliest ones in ``messages`` are removed (its ``tools`` and
  ``system`` breakpoints are kept);
- ``read_tool_output`` as an Anthropic tool; a round's answer goes back whole (thinking, text,
  calls) with ``tool_result`` blocks, an agent's call of that answer answered ``NOT_RUN``; a
  last round that must go without the tool while the history holds read calls keeps the tool
  and sets ``tool_choice: none`` when the client had no tools of its own (the API refuses tool
  blocks without any tool defined);
- answers, streams (``anthropic_stream``), usage summed over rounds (input, output, cache
  reads and writes), errors in Anthropic's shape.
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from policies.conversation import Message
from policies.tokens import TokenCounter
from proxy.dialects.anthropic_cache import breakpoints, place
from proxy.dialects.anthropic_from_chat import anthropic_message, anthropic_request, breakpoint_blocks
from proxy.dialects.anthropic_messages import Read, read_messages
from proxy.dialects.anthropic_render import render
from proxy.dialects.anthropic_stream import AnthropicStream, blocks_of_stream, error_event
from proxy.dialects.base import NOT_RUN, Answer, BaseDialect, Headers, Parsed, Usage
from proxy.dialects.hidden_rounds import HiddenRounds, echoed_answers, splice_rounds
from proxy.dialects.usage_fields import int_field
from proxy.read_tool.tool import TOOL_NAME, tool_schema
from proxy.telemetry.shadow import FINAL_ANSWER, decision_signature
from proxy.wire.errors import ProxyError
from proxy.wire.response_writer import ResponseWriter
from proxy.wire.sse_framer import event_data, recorded_events

# The prompt side of a round's usage: an answer reports the context it was produced in.
_PROMPT_KEYS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
# Models whose thinking blocks are bound to the conversation before them ("preserved thinking"):
# a request whose history or tools the proxy changed asks the API to drop the blocks that no
# longer match, instead of refusing the request.
BOUND_THINKING_MODELS = ("claude-fable-5*", "claude-mythos-5*", "claude-*-5-5*")
BINDING_BETA = "thinking-binding-controls-2026-08-01"


def neutral_tools(tools: Any) -> list[Any]:
    """Tools as Chat Completions declares them (counted the same through every door); server
    tools (``web_search_...``, ``bash_...``) as they are."""
    neutral: list[Any] = []
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict) and "input_schema" in tool:
            function = {"name": tool.get("name"), "description": tool.get("description", "")}
            neutral.append({"type": "function", "function": {**function, "parameters": tool["input_schema"]}})
        else:
            neutral.append(tool)
    return neutral


def with_thinking_rebound(body: dict[str, Any]) -> dict[str, Any]:
    """A request the proxy changed, for a model whose thinking blocks are bound to what came
    before them: the API is asked to drop the blocks a compaction or the read tool invalidated
    (``thinking.block_binding``), not to refuse the request (the route adds its beta header)."""
    model = body.get("model")
    thinking = body.get("thinking")
    if not isinstance(model, str) or not any(fnmatch.fnmatchcase(model, p) for p in BOUND_THINKING_MODELS):
        return body
    if isinstance(thinking, dict) and thinking.get("type") == "disabled":
        return body
    base = thinking if isinstance(thinking, dict) else {"type": "adaptive"}
    return {**body, "thinking": {**base, "block_binding": {"prefix_mismatch_behavior": "drop_block"}}}


def binding_headers(headers: list[tuple[bytes, bytes]], body: dict[str, Any]) -> list[tuple[bytes, bytes]]:
    """``headers`` with the beta that ``thinking.block_binding`` needs, when the body uses it."""
    thinking = body.get("thinking")
    if not (isinstance(thinking, dict) and "block_binding" in thinking):
        return headers
    beta = BINDING_BETA.encode()
    current = next((v for k, v in headers if k == b"anthropic-beta"), None)
    if current is None:
        return [*headers, (b"anthropic-beta", beta)]
    if beta in current.split(b","):
        return headers
    return [(k, v + b"," + beta if k == b"anthropic-beta" else v) for k, v in headers]


def prompt_tokens(usage: Any) -> int:
    """All the prompt tokens an answer's usage reports: uncached, cache writes and reads."""
    if not isinstance(usage, dict):
        return 0
    keys = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    return sum(v for k in keys if isinstance(v := usage.get(k), int) and not isinstance(v, bool))


_BILLED_KEYS = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens", "output_tokens")


class AnthropicDialect(BaseDialect):
    tool_call_marker = b'"tool_use"'
    cached_input_ratio = 0.1
    cache_write_ratio = 1.25
    name = "anthropic"

    def __init__(self, hidden: HiddenRounds | None = None) -> None:
        """``hidden``: where read rounds the client never saw are kept, to be put back when
        the client echoes their answer (None: not kept, as in a worker process)."""
        self.hidden = hidden

    def parse(self, body: Any, known: int = 0) -> Parsed:
        if not isinstance(body, dict):
            raise ProxyError(400, "The request body must be a JSON object.")
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise ProxyError(400, "messages: Field required", param="messages")
        read = read_messages(body)
        tools = body.get("tools")
        notes: dict[str, Any] = {
            "messages": len(messages),
            "tools": len(tools) if isinstance(tools, list) else 0,
            "cache_breakpoints": breakpoints(body),
        }
        if read.thinking_blocks:
            notes["thinking_blocks"] = read.thinking_blocks
        if read.server_blocks:
            notes["server_tool_blocks"] = read.server_blocks
        if read.media:
            notes["media"] = read.media  # estimated counts: not a calibration sample
        neutral: dict[str, Any] = {"model": body.get("model"), "messages": read.messages}
        if isinstance(body.get("tools"), list):
            neutral["tools"] = neutral_tools(body["tools"])
        if isinstance(body.get("max_tokens"), int):
            neutral["max_tokens"] = body["max_tokens"]
        return Parsed(
            body=body,
            neutral=neutral,
            stream=body.get("stream") is True,
            skipped=read.problem,
            notes=notes,
            private=read,
        )

    def render(self, parsed: Parsed, view: Sequence[Message], origin: Sequence[int]) -> dict[str, Any]:
        read: Read = parsed.private
        rendered = render(parsed.body, read, view, origin)
        body = {**parsed.body, "messages": rendered.messages}
        if rendered.system is not parsed.body.get("system"):
            body["system"] = rendered.system
        marker = rendered.cache_block
        if marker is not None and marker.get("cache_control") is None:
            # The compacted prefix (up to the summary or the last placeholder) is cached, and
            # read back until the next compaction point.
            skipped = place(body, marker)
            parsed.notes["cache_breakpoint"] = rendered.cache_block_kind if skipped is None else skipped
        return with_thinking_rebound(body)

    def count(self, body: dict[str, Any], counter: TokenCounter) -> int:
        neutral = {
            "model": body.get("model"),
            "messages": read_messages(body).messages,
            "tools": neutral_tools(body.get("tools")),
        }
        return counter.count_request(neutral).total

    def upstream_headers(self, headers: Headers, body: dict[str, Any] | None) -> Headers:
        return binding_headers(headers, body) if body is not None else headers

    def restores(self) -> bool:
        return self.hidden is not None and self.hidden.active()

    def restore_wanted(self, data: Any) -> list[Any]:
        return echoed_answers(data)

    async def restore_found(self, tenant: str, wanted: list[Any]) -> Any:
        return await self.hidden.lookup(tenant, wanted) if self.hidden is not None else {}

    def restore_splice(self, data: Any, found: Any) -> tuple[Any, int]:
        return splice_rounds(data, found) if isinstance(data, dict) else (data, 0)

    def read_loop_start(self, body: dict[str, Any]) -> Any:
        return len(body.get("messages") or [])

    async def read_loop_end(self, tenant: str, mark: Any, body: dict[str, Any], result: Any) -> None:
        """The client gets the last round only: what it did not see is kept, for when it
        echoes the answer."""
        if self.hidden is None or not mark or not result.rounds:
            return
        if result.status != 200 or result.error or not result.final_answer:
            return
        answer = [b for b in result.final_answer if not self.is_read_call(b)]
        await self.hidden.record(tenant, body["messages"][mark:], answer)

    def with_read_tool(self, body: dict[str, Any], max_lines: int) -> dict[str, Any]:
        tools = body.get("tools")
        tools = [*(tools if isinstance(tools, list) else []), _read_tool(max_lines)]
        return with_thinking_rebound({**body, "tools": tools})

    def without_read_tool(self, body: dict[str, Any]) -> dict[str, Any]:
        tools = body.get("tools") or []
        others = [t for t in tools if not (isinstance(t, dict) and t.get("name") == TOOL_NAME)]
        if others:
            return {**body, "tools": others}
        # Only the read tool: with read calls in the history the API wants a tool defined, so it
        # stays and may not be called.
        return {**body, "tool_choice": {"type": "none"}}

    def is_read_call(self, call: Any) -> bool:
        return isinstance(call, dict) and call.get("type") == "tool_use" and call.get("name") == TOOL_NAME

    def call_arguments(self, call: Any) -> Any:
        return call.get("input") if isinstance(call, dict) else None

    def json_answer(self, data: Any) -> Answer | None:
        content = data.get("content") if isinstance(data, dict) and data.get("type") == "message" else None
        if not isinstance(content, list):
            return None
        return answer_of(content, data.get("usage"))

    def add_round(
        self, body: dict[str, Any], answer: Answer, results: Sequence[tuple[Any, str]]
    ) -> dict[str, Any]:
        reads = {id(call) for call, _ in results}
        # The answer goes back whole (its thinking is only valid with the blocks it came with),
        # but for blank text blocks, which the API refuses in a request.
        kept = [
            block
            for block in answer.items
            if isinstance(block, dict)
            and not (block.get("type") == "text" and not str(block.get("text")).strip())
        ]
        if not any(id(b) in reads for b in kept):  # the answer's blocks are not known
            kept = [
                *([{"type": "text", "text": answer.text}] if answer.text else []),
                *(call for call, _ in results),
            ]
        answered = {id(call): text for call, text in results}
        outputs = [
            {"type": "tool_result", "tool_use_id": call.get("id"), "content": answered[id(call)]}
            if id(call) in reads
            else {"type": "tool_result", "tool_use_id": call.get("id"), "content": NOT_RUN, "is_error": True}
            # The calls not run first, the reads last: the round ends with what the model asked for.
            for call in sorted((b for b in kept if b.get("type") == "tool_use"), key=lambda b: id(b) in reads)
        ]
        messages = [
            *body["messages"],
            {"role": "assistant", "content": kept},
            {"role": "user", "content": outputs},
        ]
        return {**body, "messages": messages}

    def final_json(self, data: dict[str, Any], total_usage: dict[str, int]) -> bytes:
        content = data.get("content") or []
        agent = [b for b in content if not self.is_read_call(b)]
        if len(agent) != len(content):  # the round limit: never hand the agent an internal call
            data["content"] = agent
            if not any(isinstance(b, dict) and b.get("type") == "tool_use" for b in agent):
                data["stop_reason"] = "end_turn"
        if total_usage:
            usage = data.get("usage")
            data["usage"] = {**(usage if isinstance(usage, dict) else {}), **total_usage}
        return orjson.dumps(data)

    def codec(self, writer: ResponseWriter) -> AnthropicStream:
        return AnthropicStream(writer, self.is_read_call)

    def error_event(self, error: ProxyError) -> bytes:
        return error_event(error)

    def add_usage(self, total: dict[str, int], usage: Any) -> None:
        """The last round's prompt figures (agents read them as their context size: a sum over
        read rounds would make Claude Code compact early) and the output of every round; each
        round's usage is in the compaction event."""
        if isinstance(usage, dict):
            for key in _PROMPT_KEYS:
                value = usage.get(key)
                if isinstance(value, int) and not isinstance(value, bool):
                    total[key] = value
            value = usage.get("output_tokens")
            if isinstance(value, int) and not isinstance(value, bool):
                total["output_tokens"] = total.get("output_tokens", 0) + value

    def decision(self, raw: bytes, sse: bool) -> str:
        blocks = blocks_of_stream(raw) if sse else _content_of_json(raw)
        for block in blocks:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                call = {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {
                        "name": block.get("name"),
                        "arguments": orjson.dumps(block.get("input")).decode(),
                    },
                }
                return decision_signature({"role": "assistant", "tool_calls": [call]})
        return FINAL_ANSWER

    def prompt_tokens(self, usage: Any) -> int:
        return prompt_tokens(usage)

    def billed(self, usages: Iterable[Any]) -> Usage:
        """Anthropic counts cache reads and writes apart from ``input_tokens``: the prompt is
        their sum. A stream's ``message_start`` and ``message_delta`` merged field by field."""
        found = [u for u in usages if isinstance(u, dict)]
        fresh, read, written, output = (
            max((int_field(u, key) for u in found), default=0)
            for key in (
                "input_tokens",
                "cache_read_input_tokens",
                "cache_creation_input_tokens",
                "output_tokens",
            )
        )
        return Usage(prompt=fresh + read + written, cached=read, written=written, output=output)

    def reported_prompt_tokens(self, raw: bytes, sse: bool) -> int:
        """The prompt tokens an answer reports (its head suffices for a stream: message_start)."""
        if sse:
            for event in recorded_events(raw):
                if b"message_start" not in event:
                    continue
                try:
                    message = orjson.loads(event_data(event)).get("message")
                except (orjson.JSONDecodeError, AttributeError):
                    return 0
                return prompt_tokens(message.get("usage") if isinstance(message, dict) else None)
            return 0
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return 0
        return prompt_tokens(data.get("usage") if isinstance(data, dict) else None)

    def client_request(self, model: str, messages: Sequence[Message], tools: Sequence[Any]) -> dict[str, Any]:
        return anthropic_request(model, messages, tools)

    def answer_from_chat(
        self, message: Message, model: Any, answer_id: str, usage: dict[str, Any] | None
    ) -> dict[str, Any]:
        return anthropic_message(message, model, "msg_" + answer_id, usage)

    def cache_marks(self, parsed: Parsed) -> list[int]:
        read: Read = parsed.private
        return breakpoint_blocks(parsed.body, read.origins)


def answer_of(content: list[Any], usage: Any) -> Answer:
    calls = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
    text = "".join(
        b["text"]
        for b in content
        if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
    )
    return Answer(
        calls=calls, text=text or None, usage=usage if isinstance(usage, dict) else None, items=content
    )


def _content_of_json(raw: bytes) -> list[Any]:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return []
    content = data.get("content") if isinstance(data, dict) else None
    return content if isinstance(content, list) else []


@functools.lru_cache(maxsize=16)
def _read_tool(max_lines: int) -> dict[str, Any]:
    """The read tool in the Messages API's shape: one object per setting (``tool_schema``)."""
    function = tool_schema(max_lines)["function"]
    return {"name": TOOL_NAME, "description": function["description"], "input_schema": function["parameters"]}
