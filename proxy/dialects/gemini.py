"""The Gemini API (``POST /v1beta/models/{model}:generateContent`` and
``:streamGenerateContent?alt=sse``): Gemini CLI and Google's SDKs.

The model and the stream are the request's path's (``Target``): the door binds this adapter to
them (``at``). ``contents`` are read into the neutral conversation and a view written back by
``gemini_contents`` and ``gemini_render`` (thought parts and ``thoughtSignature`` stay with
their part and content, byte for byte); tools are ``gemini_tools``. This adapter adds the rest:

- ``read_tool_output`` as a function declaration; a round's answer goes back whole (thoughts,
  text, every call with its signature, as the API wrote them) in a ``model`` content, then one
  ``user`` content answering its calls part for part, in their order: a read with its result,
  an agent's call with ``NOT_RUN``;
- answers, streams (``gemini_stream``), usage summed over rounds (``usageMetadata``: the last
  round's prompt, every round's candidates and thoughts), errors in Google's shape;
- a request that continues a ``cachedContent`` (a history held upstream) or asks for several
  candidates goes as sent.

``CodeAssistDialect`` (``gemini_code_assist.py``) is the same format in Code Assist's envelope.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from policies.conversation import Message
from policies.tokens import TokenCounter
from proxy.dialects.base import NOT_RUN, Answer, BaseDialect, Parsed, Usage
from proxy.dialects.doors import BODY_SAYS, Target
from proxy.dialects.gemini_contents import CALL_PREFIX, field, key_of, read_contents
from proxy.dialects.gemini_from_chat import gemini_request, gemini_response
from proxy.dialects.gemini_render import render
from proxy.dialects.gemini_stream import GeminiStream, add_usage, error_event, parts_of_stream
from proxy.dialects.gemini_tools import neutral_tools, with_read_tool, without_read_tool
from proxy.dialects.usage_fields import int_field
from proxy.read_tool.tool import TOOL_NAME
from proxy.telemetry.shadow import FINAL_ANSWER, decision_signature
from proxy.wire.errors import ProxyError
from proxy.wire.json_body import json_text
from proxy.wire.response_writer import ResponseWriter
from proxy.wire.sse_framer import event_data, recorded_events


def _usage_of(data: Any) -> Any:
    return field(data, "usageMetadata") if isinstance(data, dict) else None


class GeminiDialect(BaseDialect):
    name = "gemini"
    prompt_key = "promptTokenCount"
    output_key = "candidatesTokenCount"
    total_key = "totalTokenCount"
    cached_path = ("cachedContentTokenCount",)
    tool_call_marker = b'"functionCall"'
    # Gemini 2.5's implicit cache reads at a quarter of the input price (no write premium).
    cached_input_ratio = 0.25
    history_field = "contents"
    # Code Assist wraps the request as ``{model, project, request}`` and each answer as
    # ``{"response": ...}``; the Gemini API does neither.
    envelope: str | None = None

    def __init__(self, target: Target = BODY_SAYS) -> None:
        self.target = target

    # --- the request's path, and the envelope ------------------------------------------------

    def at(self, target: Target) -> GeminiDialect:
        return self if target == self.target else type(self)(target)

    def streams(self, body: dict[str, Any]) -> bool:
        return self.target.stream is True

    def model_of(self, body: dict[str, Any]) -> Any:
        return self.target.model

    def json_url(self, url: str) -> str:
        """A stream's URL asking for one JSON answer: ``:generateContent``, no ``alt=sse``."""
        path, _, query = url.partition("?")
        path = path.replace(":streamGenerateContent", ":generateContent")
        kept = "&".join(p for p in query.split("&") if p and p != "alt=sse")
        return f"{path}?{kept}" if kept else path

    def inner(self, body: dict[str, Any]) -> dict[str, Any]:
        """The ``generateContent`` request a body holds."""
        return body

    def outer(self, body: dict[str, Any], inner: dict[str, Any]) -> dict[str, Any]:
        """``body`` holding ``inner`` instead."""
        return inner

    def response(self, data: Any) -> Any:
        """The ``GenerateContentResponse`` an answer holds."""
        return data.get(self.envelope) if self.envelope and isinstance(data, dict) else data

    # --- reading and writing -----------------------------------------------------------------

    def parse(self, body: Any, known: int = 0) -> Parsed:
        if not isinstance(body, dict):
            raise ProxyError(400, "Invalid JSON payload: the request must be a JSON object.")
        request = self.inner(body)
        contents = request.get("contents")
        if not isinstance(contents, list):
            raise ProxyError(400, "contents: a list of contents is required.", param="contents")
        read = read_contents(request)
        tools = field(request, "tools")
        notes: dict[str, Any] = {"contents": len(contents), "tools": len(neutral_tools(tools))}
        for note, value in (
            ("thought_parts", read.thought_parts),
            ("thought_signatures", read.signatures),
            ("media", read.media),  # estimated counts: not a calibration sample
            ("call_ids_made", read.made_ids),
            ("repeated_results", read.repeated_results),
        ):
            if value:
                notes[note] = value
        neutral: dict[str, Any] = {"model": self.model_of(body), "messages": read.messages}
        if isinstance(tools, list):
            neutral["tools"] = neutral_tools(tools)
        requested = self.answer_tokens(body)
        if requested:
            neutral["max_tokens"] = requested
        return Parsed(
            body=body,
            neutral=neutral,
            stream=self.streams(body),
            skipped=read.problem or _sent_as_is(request),
            notes=notes,
            private=read,
        )

    def render(self, parsed: Parsed, view: Sequence[Message], origin: Sequence[int]) -> dict[str, Any]:
        request = self.inner(parsed.body)
        rendered = render(request, parsed.private, view, origin)
        written = {**request, "contents": rendered.contents}
        if rendered.system is not field(request, "systemInstruction"):
            written[key_of(request, "systemInstruction")] = rendered.system
        return self.outer(parsed.body, written)

    def count(self, body: dict[str, Any], counter: TokenCounter) -> int:
        request = self.inner(body)
        neutral = {
            "model": self.model_of(body),
            "messages": read_contents(request).messages,
            "tools": neutral_tools(field(request, "tools")),
        }
        return counter.count_request(neutral).total

    def answer_tokens(self, body: dict[str, Any]) -> int:
        config = field(self.inner(body), "generationConfig")
        value = field(config, "maxOutputTokens") if isinstance(config, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    # --- the read tool and its rounds --------------------------------------------------------

    def with_read_tool(self, body: dict[str, Any], max_lines: int) -> dict[str, Any]:
        return self.outer(body, with_read_tool(self.inner(body), max_lines))

    def without_read_tool(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.outer(body, without_read_tool(self.inner(body)))

    def is_read_call(self, call: Any) -> bool:
        inner = field(call, "functionCall") if isinstance(call, dict) else None
        return isinstance(inner, dict) and inner.get("name") == TOOL_NAME

    def call_arguments(self, call: Any) -> Any:
        inner = field(call, "functionCall") if isinstance(call, dict) else None
        return inner.get("args") if isinstance(inner, dict) else None

    def json_answer(self, data: Any) -> Answer | None:
        response = self.response(data)
        candidates = response.get("candidates") if isinstance(response, dict) else None
        candidate = candidates[0] if isinstance(candidates, list) and candidates else None
        content = candidate.get("content") if isinstance(candidate, dict) else None
        parts = content.get("parts") if isinstance(content, dict) else None
        if not isinstance(parts, list):
            return None
        return answer_of(parts, _usage_of(response))

    def add_round(
        self, body: dict[str, Any], answer: Answer, results: Sequence[tuple[Any, str]]
    ) -> dict[str, Any]:
        request = self.inner(body)
        reads = {id(call): text for call, text in results}
        # The answer goes back whole: a signature is only valid on the part it came with.
        parts = [p for p in answer.items if isinstance(p, dict)]
        if not any(id(p) in reads for p in parts):  # the answer's parts are not known
            parts = [*([{"text": answer.text}] if answer.text else []), *(call for call, _ in results)]
        answers = [
            _answer_part(part, reads.get(id(part), NOT_RUN), id(part) in reads)
            for part in parts
            if field(part, "functionCall") is not None
        ]
        contents = [
            *request["contents"],
            {"role": "model", "parts": parts},
            {"role": "user", "parts": answers},
        ]
        return self.outer(body, {**request, "contents": contents})

    def final_json(self, data: dict[str, Any], total_usage: dict[str, int]) -> bytes:
        response = self.response(data)
        candidates = response.get("candidates") if isinstance(response, dict) else None
        candidate = candidates[0] if isinstance(candidates, list) and candidates else None
        content = candidate.get("content") if isinstance(candidate, dict) else None
        if isinstance(content, dict) and isinstance(content.get("parts"), list):
            # The round limit: never hand the agent an internal call.
            content["parts"] = [p for p in content["parts"] if not self.is_read_call(p)]
        if total_usage and isinstance(response, dict):
            usage = _usage_of(response)
            response[key_of(response, "usageMetadata")] = {
                **(usage if isinstance(usage, dict) else {}),
                **total_usage,
            }
        return orjson.dumps(data)

    def codec(self, writer: ResponseWriter) -> GeminiStream:
        return GeminiStream(writer, self.is_read_call, self.envelope)

    def error_event(self, error: ProxyError) -> bytes:
        return error_event(error)

    # --- usage -------------------------------------------------------------------------------

    def add_usage(self, total: dict[str, int], usage: Any) -> None:
        add_usage(total, usage)

    def billed(self, usages: Iterable[Any]) -> Usage:
        """A stream's usage objects merged field by field; thoughts are billed as output."""
        found = [u for u in usages if isinstance(u, dict)]
        prompt, cached, output, thoughts = (
            max((int_field(u, key) for u in found), default=0)
            for key in (
                "promptTokenCount",
                "cachedContentTokenCount",
                "candidatesTokenCount",
                "thoughtsTokenCount",
            )
        )
        return Usage(prompt=prompt, cached=cached, output=output + thoughts)

    def reported_prompt_tokens(self, raw: bytes, sse: bool) -> int:
        """The prompt tokens an answer reports (a stream's first event with usage says)."""
        if not sse:
            try:
                return self.prompt_tokens(_usage_of(self.response(orjson.loads(raw))))
            except orjson.JSONDecodeError:
                return 0
        for event in recorded_events(raw):
            try:
                tokens = self.prompt_tokens(_usage_of(self.response(orjson.loads(event_data(event)))))
            except orjson.JSONDecodeError:
                continue
            if tokens:
                return tokens
        return 0

    def decision(self, raw: bytes, sse: bool) -> str:
        if sse:
            parts = parts_of_stream(raw, self.envelope)
        else:
            try:
                answer = self.json_answer(orjson.loads(raw))
            except orjson.JSONDecodeError:
                answer = None
            parts = answer.items if answer is not None else []
        for part in parts:
            call = field(part, "functionCall") if isinstance(part, dict) else None
            if isinstance(call, dict):
                chat = {
                    "id": str(call.get("id") or ""),
                    "type": "function",
                    "function": {"name": call.get("name"), "arguments": json_text(call.get("args") or {})},
                }
                return decision_signature({"role": "assistant", "tool_calls": [chat]})
        return FINAL_ANSWER

    # --- the replay --------------------------------------------------------------------------

    def client_request(self, model: str, messages: Sequence[Message], tools: Sequence[Any]) -> dict[str, Any]:
        return gemini_request(model, messages, tools)

    def answer_from_chat(
        self, message: Message, model: Any, answer_id: str, usage: dict[str, Any] | None
    ) -> dict[str, Any]:
        return gemini_response(message, model, answer_id, usage)


def _sent_as_is(request: dict[str, Any]) -> str | None:
    if request.get("cachedContent") or request.get("cached_content"):
        return "cachedContent: part of the history is held upstream"
    config = field(request, "generationConfig")
    count = field(config, "candidateCount") if isinstance(config, dict) else None
    if isinstance(count, int) and count > 1:
        return "candidateCount > 1: several answers in one response"
    return None


def _answer_part(call_part: dict[str, Any], text: str, read: bool) -> dict[str, Any]:
    """The ``functionResponse`` part that answers a call part: a read's result, else NOT_RUN."""
    call = field(call_part, "functionCall")
    answer: dict[str, Any] = {
        "name": call.get("name"),
        "response": {"output": text} if read else {"error": text},
    }
    if isinstance(call.get("id"), str) and not call["id"].startswith(CALL_PREFIX):
        answer["id"] = call["id"]
    return {"functionResponse": answer}


def answer_of(parts: list[Any], usage: Any) -> Answer:
    calls = [p for p in parts if isinstance(p, dict) and field(p, "functionCall") is not None]
    text = "".join(
        p["text"]
        for p in parts
        if isinstance(p, dict) and isinstance(p.get("text"), str) and not p.get("thought")
    )
    return Answer(
        calls=calls, text=text or None, usage=usage if isinstance(usage, dict) else None, items=parts
    )
