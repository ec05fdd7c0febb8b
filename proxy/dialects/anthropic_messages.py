"""Anthropic Messages histories read into the neutral conversation.

Reading (``read_messages``): ``system`` (a string or text blocks) is the neutral system
message; each wire message becomes neutral messages:

- an **assistant** message is one neutral assistant message: its ``text`` blocks are the
  content, its ``tool_use`` blocks the tool calls (``input`` as JSON arguments); ``thinking``
  text and server tool blocks (``server_tool_use``, ``web_search_tool_result``, ...) are
  ``wire_only`` (counted, never summarized or shown to a policy) and stay in the message;
- a **user** message's ``tool_result`` blocks are neutral tool results, one each, named after
  their call; its other blocks (text, images, documents) one neutral user message after them;
- a **system** message inside ``messages`` (Claude Code sends its environment block so for a
  model name it does not know: GLM, Kimi, DeepSeek, local models) is a neutral system message
  at its place: the fixed part, never summarized, offloaded or cut, written back as sent.

Writing a view back is ``anthropic_render.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policies.conversation import WIRE_ONLY, WIRE_TOKENS, Message
from proxy.wire.json_body import json_text

SYSTEM = -1  # the wire index of the neutral system message's source
IMAGE_TOKENS = 1600
PDF_TOKENS_PER_50KB = 2000
_IMAGE_BLOCKS = frozenset({"image", "document"})
TOOL_RESULT = "tool_result"
THINKING_BLOCKS = frozenset({"thinking", "redacted_thinking"})
# The first wire message must be the user's: when a view would open with the assistant.
OPENING = "(The conversation so far was condensed; it continues below.)"


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a neutral message came from: a wire message and its blocks (``()``: the whole
    string content), or ``SYSTEM``."""

    message: int
    blocks: tuple[int, ...] = ()


@dataclass(slots=True)
class Read:
    messages: list[Message]
    origins: list[Origin]
    problem: str | None = None  # a shape no API accepts: the request goes as sent
    thinking_blocks: int = 0
    server_blocks: int = 0
    media: int = 0  # messages with images or documents, whose tokens are estimates


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str))
    return ""


def media_tokens(block: dict[str, Any]) -> int:
    """An estimate of what an image or a document costs in Claude's count (there is no offline
    tokenizer for them): an image up to about 1,600 tokens (its size is not known without
    decoding it, so the most); a PDF about 2,000 per 50 KB (1,500-3,000 a page); a plain-text
    document is counted as its text instead (0 here)."""
    if block.get("type") == "image":
        return IMAGE_TOKENS
    source = block.get("source")
    if not isinstance(source, dict) or source.get("type") in ("text", "content"):
        return 0
    data = source.get("data")
    size = len(data) * 3 // 4 if isinstance(data, str) else 0
    return max(PDF_TOKENS_PER_50KB, PDF_TOKENS_PER_50KB * size // 51_200)


def _document_text(block: dict[str, Any]) -> str | None:
    """A document's own text (a plain-text source, or text content blocks), if it has one."""
    source = block.get("source")
    if not isinstance(source, dict):
        return None
    if source.get("type") == "text" and isinstance(source.get("data"), str):
        return str(source["data"])
    if source.get("type") == "content":
        return text_of(source.get("content"))
    return None


def _result_text(block: dict[str, Any]) -> tuple[str, int]:
    """A result's text, and the tokens its images and documents add."""
    content = block.get("content")
    if isinstance(content, str) or content is None:
        return content or "", 0
    if isinstance(content, list):
        parts, extra = [], 0
        for inner in content:
            kind = inner.get("type") if isinstance(inner, dict) else None
            if kind == "text" and isinstance(inner.get("text"), str):
                parts.append(inner["text"])
            elif kind in _IMAGE_BLOCKS:
                text = _document_text(inner) if kind == "document" else None
                parts.append(text if text is not None else f"[{kind}]")
                extra += media_tokens(inner)
            else:
                parts.append(json_text(inner))
        return "\n".join(parts), extra
    return json_text(content), 0


def _user_part(block: dict[str, Any]) -> dict[str, Any]:
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        return {"type": "text", "text": block["text"]}
    if kind == "document":
        text = _document_text(block)
        if text is not None:
            return {"type": "text", "text": text}
    if kind in _IMAGE_BLOCKS:
        return {"type": "text", "text": f"[{kind}]"}  # its tokens: media_tokens
    return {"type": "text", "text": json_text(block)}


def neutral_call(block: dict[str, Any]) -> dict[str, Any]:
    arguments = block.get("input")
    return {
        "id": str(block.get("id") or ""),
        "type": "function",
        "function": {
            "name": block["name"] if isinstance(block.get("name"), str) else "",
            "arguments": json_text(arguments if arguments is not None else {}),
        },
    }


def _block_problem(blocks: list[Any], where: str) -> str | None:
    for position, block in enumerate(blocks):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            return f"{where}.content[{position}] must be an object with a type"
    return None


def read_messages(body: dict[str, Any]) -> Read:
    read = Read(messages=[], origins=[])
    system = body.get("system")
    if isinstance(system, str | list) and system:
        read.messages.append({"role": "system", "content": text_of(system)})
        read.origins.append(Origin(SYSTEM))
    wire = body.get("messages")
    names: dict[str, str] = {}  # tool_use id -> tool name, for the results that answer them
    for index, message in enumerate(wire if isinstance(wire, list) else []):
        where = f"messages[{index}]"
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant", "system"):
            read.problem = read.problem or f"{where} must be an object with role user, assistant or system"
            continue
        role, content = message["role"], message.get("content")
        if isinstance(content, str):
            read.messages.append({"role": role, "content": content})
            read.origins.append(Origin(index))
            continue
        if not isinstance(content, list):
            read.problem = read.problem or f"{where}.content must be a string or an array of blocks"
            continue
        problem = _block_problem(content, where)
        if problem:
            read.problem = read.problem or problem
            continue
        if role == "system":
            read.messages.append({"role": "system", "content": text_of(content)})
            read.origins.append(Origin(index, tuple(range(len(content)))))
        elif role == "assistant":
            _read_assistant(read, index, content, names)
        else:
            _read_user(read, index, content, names)
    return read


def _read_assistant(read: Read, index: int, content: list[dict[str, Any]], names: dict[str, str]) -> None:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    wire_only: list[str] = []
    for block in content:
        kind = block["type"]
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            calls.append(neutral_call(block))
        elif kind == "thinking":
            read.thinking_blocks += 1
            if isinstance(block.get("thinking"), str):
                wire_only.append(block["thinking"])
        elif kind == "redacted_thinking":
            read.thinking_blocks += 1
        else:  # server tool blocks and any block this proxy does not know: counted as JSON
            read.server_blocks += 1
            wire_only.append(json_text(block))
    names.update((c["id"], c["function"]["name"]) for c in calls)
    neutral: Message = {"role": "assistant", "content": "\n".join(texts) if texts else None}
    if calls:
        neutral["tool_calls"] = calls
    if wire_only:
        neutral[WIRE_ONLY] = "\n".join(wire_only)
    read.messages.append(neutral)
    read.origins.append(Origin(index, tuple(range(len(content)))))


def _read_user(read: Read, index: int, content: list[dict[str, Any]], names: dict[str, str]) -> None:
    rest: list[int] = []
    for position, block in enumerate(content):
        if block["type"] != TOOL_RESULT:
            rest.append(position)
            continue
        call_id = block.get("tool_use_id")
        text, extra = _result_text(block)
        result: Message = {"role": "tool", "tool_call_id": str(call_id or ""), "content": text}
        if isinstance(call_id, str) and call_id in names:
            result["name"] = names[call_id]
        if extra:
            result[WIRE_TOKENS] = extra
            read.media += 1
        read.messages.append(result)
        read.origins.append(Origin(index, (position,)))
    if rest or not content:
        message: Message = {"role": "user", "content": [_user_part(content[p]) for p in rest]}
        extra = sum(media_tokens(content[p]) for p in rest if content[p]["type"] in _IMAGE_BLOCKS)
        if extra:
            message[WIRE_TOKENS] = extra
            read.media += 1
        read.messages.append(message)
        read.origins.append(Origin(index, tuple(rest)))
