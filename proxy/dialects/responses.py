"""The Responses API (``POST /v1/responses``): items read into the neutral conversation, and a
view written back with every untouched item exactly as it came.

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

Requests with ``previous_response_id`` or ``conversation`` continue a history the proxy cannot
see: they go upstream as sent (``x-compaction-skipped`` says so). ``read_tool_output`` is a
Responses function tool; a round's reasoning items and read calls go back with their outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from policies.conversation import OPAQUE_ROLE, Message
from policies.tokens import TokenCounter
from proxy.dialects.base import NOT_RUN, Answer, BaseDialect, Parsed
from proxy.dialects.responses_stream import ResponsesStream, error_event
from proxy.errors import ProxyError
from proxy.read_tool import TOOL_NAME, tool_schema
from proxy.response_writer import ResponseWriter
from proxy.shadow import FINAL_ANSWER, decision_signature

_CALLS = frozenset({"function_call", "custom_tool_call", "local_shell_call"})
_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output", "local_shell_call_output"})
_OUTPUT_OF = {
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


def _text_of(content: Any) -> str:
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
        return orjson.dumps(content).decode()
    parts: list[Any] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind in _IMAGE_PARTS:
            parts.append({"type": "image_url", "image_url": {"url": part.get("image_url") or ""}})
        else:
            parts.append({"type": "text", "text": orjson.dumps(part).decode()})
    return parts


def _call(item: dict[str, Any]) -> dict[str, Any]:
    """A call item as a neutral tool call (its arguments a JSON object, as the vocabulary reads)."""
    kind = item.get("type")
    if kind == "function_call":
        name, arguments = item.get("name"), item.get("arguments")
        arguments = arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()
    elif kind == "custom_tool_call":
        name, arguments = item.get("name"), orjson.dumps({"input": item.get("input")}).decode()
    else:  # local_shell_call
        name, arguments = "local_shell", orjson.dumps(item.get("action") or {}).decode()
    return {
        "id": str(item.get("call_id") or item.get("id") or ""),
        "type": "function",
        "function": {"name": name if isinstance(name, str) else "", "arguments": arguments},
    }


def _output_text(item: dict[str, Any]) -> str:
    output = item.get("output")
    if isinstance(output, str):
        return output
    return _text_of(output) or orjson.dumps(output).decode()


def _is_turn_item(item: Any) -> bool:
    kind = item.get("type") if isinstance(item, dict) else None
    return kind in _TURN_ITEMS or kind in _CALLS or (kind == "message" and item.get("role") == "assistant")


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
            text = "\n".join(_text_of(i.get("content")) for i in turn if i.get("type") == "message")
            calls = [_call(i) for i in turn if i.get("type") in _CALLS]
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
            messages.append({"role": OPAQUE_ROLE, "content": orjson.dumps(item).decode()})
        sources.append((index,))
        index += 1
    return messages, Sources(tuple(sources), input_string=False)


def _count_items(raw: Any, kind: str) -> int:
    if not isinstance(raw, list):
        return 0
    return sum(1 for i in raw if isinstance(i, dict) and i.get("type") == kind)


def _message_item(role: str, text: str) -> dict[str, Any]:
    part = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": part, "text": text}]}


def _changed_items(message: Message, originals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items of a message a policy changed (a placeholder, an excerpt, a note): the
    original items with the new text or arguments, ids and everything else as they were."""
    role = message.get("role")
    text = message.get("content")
    text = text if isinstance(text, str) else _text_of(text)
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
                arguments = orjson.loads(call["function"]["arguments"])
                item = {**item, "input": arguments.get("input", item.get("input"))}
            elif kind == "message" and text is not None and _text_of(item.get("content")) != text:
                item = {**item, "content": [{"type": "output_text", "text": text}]}
            changed.append(item)
        return changed
    (item,) = originals
    kind = "input_text" if role != "assistant" else "output_text"
    return [{**item, "content": [{"type": kind, "text": text}]}]


class ResponsesDialect(BaseDialect):
    name = "responses"
    prompt_key = "input_tokens"
    output_key = "output_tokens"
    max_tokens_key = "max_output_tokens"

    def parse(self, body: Any, lenient: bool) -> Parsed:
        if not isinstance(body, dict):
            raise ProxyError(400, "The request body must be a JSON object.")
        raw = body.get("input")
        if raw is not None and not isinstance(raw, str | list):
            raise ProxyError(400, "'input' must be a string or an array of items.", param="input")
        messages, sources = read_input(body)
        notes: dict[str, Any] = {
            "items": 0 if sources.input_string else len(raw or []),
            "reasoning_items": _count_items(raw, "reasoning"),
            "item_references": _count_items(raw, "item_reference"),
            "kept_as_sent": sum(1 for m in messages if m.get("role") == OPAQUE_ROLE),
        }
        skipped = "lenient JSON" if lenient else None
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
                        body["instructions"] = _text_of(message.get("content"))
                    continue
                if sources.input_string:
                    text = _text_of(message.get("content"))
                    items.append(_message_item("user", text))
                    continue
                from_input = [raw[i] for i in where] if isinstance(raw, list) else []
                items.extend(
                    from_input if message is originals[source] else _changed_items(message, from_input)
                )
            else:
                role = message.get("role")
                text = _text_of(message.get("content"))
                items.append(_message_item(str(role), text))
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
        schema = tool_schema(max_lines)["function"]
        tool = {"type": "function", **schema, "strict": False}
        tools = body.get("tools")
        return {**body, "tools": [*(tools if isinstance(tools, list) else []), tool]}

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
        items: list[Any] = [_message_item("user", raw)] if isinstance(raw, str) else list(raw or [])
        answered = {id(call): text for call, text in results}
        # The round goes back whole (reasoning is only valid with the items that followed it);
        # the agent's calls of that answer are answered NOT_RUN, to be re-issued.
        round_items = [i for i in answer.items if isinstance(i, dict)]
        if not any(id(i) in answered for i in round_items):  # the answer's items are not known
            round_items = [call for call, _ in results]
        items += round_items
        calls = [i for i in round_items if i.get("type") in _CALLS]
        # The calls not run first, the reads last: the round ends with what the model asked for.
        items += [
            {
                "type": _OUTPUT_OF.get(str(i.get("type")), "function_call_output"),
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
            if isinstance(item, dict) and item.get("type") in _CALLS:
                return decision_signature({"role": "assistant", "tool_calls": [_call(item)]})
        return FINAL_ANSWER


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
    calls = [i for i in output if isinstance(i, dict) and i.get("type") in _CALLS]
    text = "".join(
        _text_of(i.get("content")) for i in output if isinstance(i, dict) and i.get("type") == "message"
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
