"""Chat Completions (``POST /v1/chat/completions``): the neutral conversation is this format's
own ``messages``, so reading and writing a view is direct.

Streams are ``data: {chat.completion.chunk}`` events ending in ``data: [DONE]``; a failure
after the response started is an OpenAI-style ``data: {"error": ...}`` event, which the SDKs
raise as ``APIError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from policies.conversation import Message, shape_problem
from policies.pipeline import requested_answer_tokens
from policies.tokens import TokenCounter
from proxy.dialects.base import HELD_TEXT_CHARS, Answer, Parsed
from proxy.errors import ProxyError
from proxy.read_tool import TOOL_NAME, tool_schema
from proxy.response_writer import ResponseWriter, chat_error_event
from proxy.shadow import chat_decision


def _data(event: bytes) -> bytes:
    return b"".join(line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:"))


def add_round_usage(
    total: dict[str, int], usage: dict[str, Any], prompt: str, output: str, whole: str
) -> None:
    """One more round into ``total``: its prompt figure replaces the last one, its output adds."""
    value = usage.get(prompt)
    if isinstance(value, int) and not isinstance(value, bool):
        total[prompt] = value
    value = usage.get(output)
    if isinstance(value, int) and not isinstance(value, bool):
        total[output] = total.get(output, 0) + value
    total[whole] = total.get(prompt, 0) + total.get(output, 0)


def json_usage(raw: bytes) -> Any:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return data.get("usage") if isinstance(data, dict) else None


def is_read_call(call: Any) -> bool:
    function = call.get("function") if isinstance(call, dict) else None
    return isinstance(function, dict) and function.get("name") == TOOL_NAME


def _is_read_tool(tool: Any) -> bool:
    function = tool.get("function") if isinstance(tool, dict) else None
    return isinstance(function, dict) and function.get("name") == TOOL_NAME


class ChatDialect:
    name = "chat"

    def parse(self, body: Any, lenient: bool) -> Parsed:
        if not isinstance(body, dict):
            raise ProxyError(400, "The request body must be a JSON object.")
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise ProxyError(400, "'messages' is a required property and must be an array.", param="messages")
        skipped = "lenient JSON" if lenient else shape_problem(messages)
        return Parsed(body=body, neutral=body, stream=body.get("stream") is True, skipped=skipped)

    def render(self, parsed: Parsed, view: Sequence[Message], origin: Sequence[int]) -> dict[str, Any]:
        return {**parsed.body, "messages": list(view)}

    def answer_tokens(self, body: dict[str, Any]) -> int:
        return requested_answer_tokens(body)

    def count(self, body: dict[str, Any], counter: TokenCounter) -> int:
        return counter.count_request(body).total

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

    def prompt_tokens(self, usage: Any) -> int:
        value = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    def reported_prompt_tokens(self, raw: bytes, sse: bool) -> int:
        if sse:
            return 0  # a stream reports usage in its last chunk, if asked to
        return self.prompt_tokens(json_usage(raw))

    def add_usage(self, total: dict[str, int], usage: Any) -> None:
        """The last round's prompt (the context the answer came from, which agents read as their
        context size) and every round's completion; each round's usage is in the event."""
        if isinstance(usage, dict):
            add_round_usage(total, usage, "prompt_tokens", "completion_tokens", "total_tokens")


def _as_stop(event: bytes) -> bytes:
    try:
        chunk = orjson.loads(_data(event))
        chunk["choices"][0]["finish_reason"] = "stop"
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return event
    return b"data: " + orjson.dumps(chunk)


class ChatStream:
    """One upstream SSE stream as the client should see it: text relayed at once, tool-call
    deltas, the finishing chunk, usage and ``[DONE]`` held until the calls are known. An empty
    opening delta (the role) is held too, so a round that only reads has sent nothing yet."""

    def __init__(self, writer: ResponseWriter) -> None:
        self.writer = writer
        self.held: list[bytes] = []
        self.closing: list[bytes] = []
        self.preamble: list[bytes] = []
        # Parts joined on demand: a round of 100,000 tiny deltas must not copy a growing string
        # 100,000 times.
        self._text: list[str] = []
        self.usage: dict[str, Any] | None = None
        self.complete = False
        self.error: Any = None
        self._usage_event: dict[str, Any] | None = None
        self._calls: dict[int, dict[str, Any]] = {}
        self._call_parts: dict[int, tuple[list[str], list[str]]] = {}  # name, arguments
        self._text_held: list[bytes] = []
        self._held_chars = 0
        self._streaming_text = False

    @property
    def text(self) -> str:
        if len(self._text) > 1:
            self._text = ["".join(self._text)]
        return self._text[0] if self._text else ""

    async def take(self, event: bytes) -> None:
        data = _data(event)
        if not data:
            return
        if data == b"[DONE]":
            self.complete = True
            return
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            await self._relay(event)
            return
        if isinstance(chunk, dict) and "error" in chunk and not chunk.get("choices"):
            self.error = chunk["error"]
            await self._relay(event)
            return
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        if isinstance(chunk, dict) and chunk.get("usage") and not choices:
            self.usage, self._usage_event = chunk["usage"], chunk
            return
        choice = choices[0] if isinstance(choices, list) and choices else None
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if isinstance(choice, dict) and isinstance(delta, dict) and delta.get("tool_calls"):
            for part in delta["tool_calls"]:
                if isinstance(part, dict):
                    self._merge(part)
            self.held.append(event)
            if not choice.get("finish_reason"):
                return
        if isinstance(choice, dict) and choice.get("finish_reason"):
            self.complete = True
            if isinstance(chunk.get("usage"), dict):
                self.usage = chunk["usage"]
            if not (isinstance(delta, dict) and delta.get("tool_calls")):
                self.closing.append(event)
            return
        content = delta.get("content") if isinstance(delta, dict) else None
        if isinstance(content, str):
            self._text.append(content)
        if not content and not self.writer.started:
            self.preamble.append(event)
            return
        if content and not self._streaming_text:
            # The first words of a round are held: a round that turns out to read saved outputs
            # ("Checking a saved output first.") never shows them, streamed or not, so clients
            # that parse the final text (structured output) see the same answer either way.
            self._text_held.append(event)
            self._held_chars += len(content)
            if self._held_chars <= HELD_TEXT_CHARS:
                return
            self._streaming_text = True
            held, self._text_held = self._text_held, []
            for early in held:
                await self._relay(early)
            return
        await self._relay(event)

    def _merge(self, part: dict[str, Any]) -> None:
        index = part.get("index", 0)
        slot = index if isinstance(index, int) else 0
        call = self._calls.setdefault(
            slot, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        names, arguments = self._call_parts.setdefault(slot, ([], []))
        if part.get("id"):
            call["id"] = part["id"]
        function = part.get("function")
        if isinstance(function, dict):
            names.append(function.get("name") or "")
            arguments.append(function.get("arguments") or "")

    def items(self) -> list[Any]:
        return []  # a chat round's calls and text are all ``add_round`` needs

    def calls(self) -> list[Any]:
        for slot, (names, arguments) in self._call_parts.items():
            function = self._calls[slot]["function"]
            function["name"] += "".join(names)
            function["arguments"] += "".join(arguments)
            names.clear()
            arguments.clear()
        return [self._calls[i] for i in sorted(self._calls)]

    async def _relay(self, event: bytes) -> None:
        if self.preamble:
            held, self.preamble = self.preamble, []
            for early in held:
                await self.writer.write(early + b"\n\n")
        await self.writer.write(event + b"\n\n")

    def _without_internal(self) -> list[bytes]:
        """The held tool-call events without ``read_tool_output`` calls (the round limit was
        reached with the model still reading: never hand the agent an internal call)."""
        internal = {i for i, c in self._calls.items() if c["function"]["name"] == TOOL_NAME}
        if not internal:
            return self.held
        kept: list[bytes] = []
        for event in self.held:
            chunk = orjson.loads(_data(event))
            delta = chunk["choices"][0]["delta"]
            delta["tool_calls"] = [p for p in delta["tool_calls"] if p.get("index", 0) not in internal]
            if delta["tool_calls"] or chunk["choices"][0].get("finish_reason"):
                if not delta["tool_calls"]:
                    del delta["tool_calls"]
                    chunk["choices"][0]["finish_reason"] = "stop"
                kept.append(b"data: " + orjson.dumps(chunk))
        if len(internal) == len(self._calls):
            # Only reads were asked for: the answer ends as a plain stop.
            self.closing = [_as_stop(event) for event in self.closing]
        return kept

    async def finish(self, total_usage: dict[str, int]) -> None:
        # The held preamble goes first (``_relay`` sends it before any event), then held text.
        for event in (*self._text_held, *self._without_internal(), *self.closing):
            await self._relay(event)
        for early in self.preamble:
            await self.writer.write(early + b"\n\n")
        self.preamble = []
        if self._usage_event is not None:
            self._usage_event["usage"] = {**self._usage_event["usage"], **total_usage}
            await self._relay(b"data: " + orjson.dumps(self._usage_event))
        await self.writer.finish(b"data: [DONE]\n\n")
