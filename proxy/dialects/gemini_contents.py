"""Gemini ``generateContent`` bodies read into the neutral conversation.

``systemInstruction`` (its text parts) is the neutral system message; each of ``contents``
becomes neutral messages:

- a ``model`` content is one assistant message: its text parts are the content, its
  ``functionCall`` parts the tool calls (``args`` as JSON arguments); thought parts
  (``thought: true``), code execution and media parts are ``wire_only`` (counted, never
  summarized or shown to a policy) and every part, ``thoughtSignature`` and all, stays in its
  message, byte for byte;
- a ``user`` content's ``functionResponse`` parts are neutral tool results, one each, named
  after their call (a ``response`` of one string field is its text, Gemini CLI's
  ``{"output": ...}``; any other its JSON); a second result for the same call in one content
  (Gemini CLI repeats them in a resumed history) goes with the first, its text ``wire_only``;
  its other parts (text, ``inlineData``, ``fileData``) one neutral user message after them. The
  old role ``function`` reads as ``user``.

Calls and results pair as the API pairs them: a result naming a call's ``id`` answers it;
otherwise the results of a user content answer the calls of the model content before it, part
for part (by name, then in order). A call without an ``id`` gets one made of its place
(``CALL_PREFIX`` + content and part index), the same at every request of an append-only
history, and never written to the wire. The REST API's snake_case field names are read too.
Writing a view back is ``gemini_render.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policies.conversation import WIRE_ONLY, WIRE_TOKENS, Message
from proxy.wire.json_body import json_text

SYSTEM = -1  # the wire index of the neutral system message's source
CALL_PREFIX = "gemini-call-"
# The first content must be the user's: when a view would open with the model.
OPENING = "(The conversation so far was condensed; it continues below.)"
# What Gemini counts for an image at its default resolution (at most), and for other media a
# token per this many bytes of data (audio is 32 tokens a second, video about 300).
IMAGE_TOKENS = 1120
MEDIA_BYTES_PER_TOKEN = 40
_CAMEL = {
    "function_call": "functionCall",
    "function_response": "functionResponse",
    "inline_data": "inlineData",
    "file_data": "fileData",
    "thought_signature": "thoughtSignature",
    "executable_code": "executableCode",
    "code_execution_result": "codeExecutionResult",
    "mime_type": "mimeType",
    "file_uri": "fileUri",
    "system_instruction": "systemInstruction",
    "generation_config": "generationConfig",
    "max_output_tokens": "maxOutputTokens",
    "candidate_count": "candidateCount",
    "function_declarations": "functionDeclarations",
    "parameters_json_schema": "parametersJsonSchema",
    "tool_config": "toolConfig",
    "function_calling_config": "functionCallingConfig",
    "allowed_function_names": "allowedFunctionNames",
    "usage_metadata": "usageMetadata",
    "finish_reason": "finishReason",
}
_SNAKE = {camel: snake for snake, camel in _CAMEL.items()}
_MEDIA = ("inlineData", "fileData")


def field(data: dict[str, Any], name: str) -> Any:
    """``data[name]``, the camelCase name, or its snake_case spelling."""
    if name in data:
        return data[name]
    snake = _SNAKE.get(name)
    return data.get(snake) if snake is not None else None


def key_of(data: dict[str, Any], name: str) -> str:
    """The spelling of ``name`` that ``data`` uses (camelCase when it has neither)."""
    if name in data:
        return name
    snake = _SNAKE.get(name)
    return snake if snake is not None and snake in data else name


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a neutral message came from: a content and its parts, or ``SYSTEM``."""

    content: int
    parts: tuple[int, ...] = ()


@dataclass(slots=True)
class Read:
    messages: list[Message]
    origins: list[Origin]
    problem: str | None = None  # a shape the API refuses: the request goes as sent
    thought_parts: int = 0
    signatures: int = 0
    media: int = 0  # parts with inline or file data, whose tokens are estimates
    made_ids: int = 0  # calls without an id, given one made of their place
    repeated_results: int = 0  # a call's second result in one content, kept with the first


def text_of(parts: Any) -> str:
    """The text of parts that are not thoughts (or of a plain string)."""
    if isinstance(parts, str):
        return parts
    if not isinstance(parts, list):
        return ""
    return "\n".join(
        p["text"]
        for p in parts
        if isinstance(p, dict) and isinstance(p.get("text"), str) and not p.get("thought")
    )


def media_tokens(part: dict[str, Any]) -> int:
    """An estimate of what an inline or file part costs: an image at most ``IMAGE_TOKENS``,
    other inline data by its size, a file by reference as an image."""
    inline = field(part, "inlineData")
    if not isinstance(inline, dict):
        return IMAGE_TOKENS if isinstance(field(part, "fileData"), dict) else 0
    mime = str(field(inline, "mimeType") or "")
    data = inline.get("data")
    size = len(data) * 3 // 4 if isinstance(data, str) else 0
    if mime.startswith("image/"):
        return IMAGE_TOKENS
    return max(IMAGE_TOKENS, size // MEDIA_BYTES_PER_TOKEN)


def _media_label(part: dict[str, Any]) -> str:
    inline, linked = field(part, "inlineData"), field(part, "fileData")
    if isinstance(inline, dict):
        return f"[inlineData {field(inline, 'mimeType') or ''}]".replace(" ]", "]")
    if isinstance(linked, dict):
        return f"[fileData {field(linked, 'mimeType') or ''} {field(linked, 'fileUri') or ''}]"
    return json_text(part)


def response_text(response: Any) -> str:
    """A function response as text: the value of its one string field, else its JSON."""
    if isinstance(response, dict) and len(response) == 1:
        (value,) = response.values()
        if isinstance(value, str):
            return value
    return json_text(response if response is not None else {})


def neutral_call(part: dict[str, Any], call_id: str) -> dict[str, Any]:
    call = field(part, "functionCall")
    arguments = call.get("args")
    return {
        "id": call_id,
        "type": "function",
        "function": {
            "name": call["name"] if isinstance(call.get("name"), str) else "",
            "arguments": json_text(arguments if arguments is not None else {}),
        },
    }


def _shape_problem(index: int, content: Any) -> str | None:
    where = f"contents[{index}]"
    if not isinstance(content, dict):
        return f"{where} must be an object"
    if content.get("role", "user") not in ("user", "model", "function"):
        return f"{where}.role must be user or model"
    parts = content.get("parts")
    if not isinstance(parts, list):
        return f"{where}.parts must be an array"
    for position, part in enumerate(parts):
        if not isinstance(part, dict):
            return f"{where}.parts[{position}] must be an object"
        call = field(part, "functionCall")
        if call is not None and not (isinstance(call, dict) and isinstance(call.get("name"), str)):
            return f"{where}.parts[{position}].functionCall must have a name"
        if field(part, "functionResponse") is not None and not isinstance(
            field(part, "functionResponse"), dict
        ):
            return f"{where}.parts[{position}].functionResponse must be an object"
    return None


class _Pairs:
    """Calls waiting for their results: those of the last model content, by id and in order."""

    def __init__(self) -> None:
        self.pending: list[tuple[str, str]] = []  # (id, name)
        self.names: dict[str, str] = {}  # every call id seen -> its name

    def called(self, calls: list[dict[str, Any]]) -> None:
        self.pending = [(c["id"], c["function"]["name"]) for c in calls]
        self.names.update(self.pending)

    def answer(self, given: Any, name: Any) -> str:
        """The id of the call a result answers ("": none)."""
        if isinstance(given, str) and given:
            for entry in self.pending:
                if entry[0] == given:
                    self.pending.remove(entry)
                    return given
            if given in self.names:
                return given  # a second result for one call (Gemini CLI's --resume sends two)
        for entry in self.pending:
            if entry[1] == name:
                self.pending.remove(entry)
                return entry[0]
        if self.pending:
            return self.pending.pop(0)[0]
        return given if isinstance(given, str) else ""


def read_contents(body: dict[str, Any]) -> Read:
    read = Read(messages=[], origins=[])
    system = field(body, "systemInstruction")
    if isinstance(system, dict) and text_of(system.get("parts")):
        read.messages.append({"role": "system", "content": text_of(system.get("parts"))})
        read.origins.append(Origin(SYSTEM))
    elif isinstance(system, str) and system:
        read.messages.append({"role": "system", "content": system})
        read.origins.append(Origin(SYSTEM))
    pairs = _Pairs()
    for index, content in enumerate(body.get("contents") or []):
        problem = _shape_problem(index, content)
        if problem:
            read.problem = read.problem or problem
            continue
        if content.get("role") == "model":
            _read_model(read, index, content["parts"], pairs)
        else:
            _read_user(read, index, content["parts"], pairs)
    return read


def _read_model(read: Read, index: int, parts: list[dict[str, Any]], pairs: _Pairs) -> None:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    wire_only: list[str] = []
    extra = 0
    for position, part in enumerate(parts):
        if field(part, "thoughtSignature") is not None:
            read.signatures += 1
        if field(part, "functionCall") is not None:
            given = field(part, "functionCall").get("id")
            if not (isinstance(given, str) and given):
                given = f"{CALL_PREFIX}{index}-{position}"
                read.made_ids += 1
            calls.append(neutral_call(part, given))
        elif isinstance(part.get("text"), str):
            if part.get("thought"):
                read.thought_parts += 1
                wire_only.append(part["text"])
            else:
                texts.append(part["text"])
        elif any(field(part, m) is not None for m in _MEDIA):
            extra += media_tokens(part)
            read.media += 1
        elif set(part) - {"thoughtSignature", "thought_signature", "thought"}:
            wire_only.append(json_text(part))  # code execution and any part this proxy does not know
    pairs.called(calls)
    neutral: Message = {"role": "assistant", "content": "\n".join(texts) if texts else None}
    if calls:
        neutral["tool_calls"] = calls
    if wire_only:
        neutral[WIRE_ONLY] = "\n".join(wire_only)
    if extra:
        neutral[WIRE_TOKENS] = extra
    read.messages.append(neutral)
    read.origins.append(Origin(index, tuple(range(len(parts)))))


def _read_user(read: Read, index: int, parts: list[dict[str, Any]], pairs: _Pairs) -> None:
    rest: list[int] = []
    answered: dict[str, int] = {}  # call id -> its result's place in read.messages
    for position, part in enumerate(parts):
        answer = field(part, "functionResponse")
        if not isinstance(answer, dict):
            rest.append(position)
            continue
        name = answer.get("name")
        call_id = pairs.answer(answer.get("id"), name)
        if call_id and call_id in answered:
            _second_result(read, answered[call_id], position, answer)
            continue
        answered[call_id] = len(read.messages)
        result: Message = {
            "role": "tool",
            "tool_call_id": call_id,
            "content": response_text(answer.get("response")),
        }
        if isinstance(name, str):
            result["name"] = name
        inner = answer.get("parts")
        if isinstance(inner, list) and inner:
            result[WIRE_TOKENS] = sum(media_tokens(p) for p in inner if isinstance(p, dict))
            read.media += 1
        read.messages.append(result)
        read.origins.append(Origin(index, (position,)))
    if rest or not parts:
        message: Message = {"role": "user", "content": [_user_part(parts[p]) for p in rest]}
        extra = sum(media_tokens(parts[p]) for p in rest)
        if extra:
            message[WIRE_TOKENS] = extra
            read.media += 1
        read.messages.append(message)
        read.origins.append(Origin(index, tuple(rest)))


def _second_result(read: Read, at: int, position: int, answer: dict[str, Any]) -> None:
    """A second result for one call in one content (Gemini CLI's ``--resume`` repeats them):
    a part of the first one's message, counted and written back with it."""
    first = read.messages[at]
    text = response_text(answer.get("response"))
    first[WIRE_ONLY] = f"{first[WIRE_ONLY]}\n{text}" if WIRE_ONLY in first else text
    origin = read.origins[at]
    read.origins[at] = Origin(origin.content, (*origin.parts, position))
    read.repeated_results += 1


def _user_part(part: dict[str, Any]) -> dict[str, Any]:
    if isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    return {"type": "text", "text": _media_label(part)}
