"""Anthropic Messages histories read into the neutral conversation, and views written back.

Reading (``read_messages``): ``system`` (a string or text blocks) is the neutral system
message; each wire message becomes neutral messages:

- an **assistant** message is one neutral assistant message: its ``text`` blocks are the
  content, its ``tool_use`` blocks the tool calls (``input`` as JSON arguments); ``thinking``
  text and server tool blocks (``server_tool_use``, ``web_search_tool_result``, ...) are
  ``wire_only`` (counted, never summarized or shown to a policy) and stay in the message;
- a **user** message's ``tool_result`` blocks are neutral tool results, one each, named after
  their call; its other blocks (text, images, documents) one neutral user message after them.

Writing (``render``) groups the view's messages back into alternating wire messages: a
message the policies did not touch is its original blocks (a wire message whose pieces are all
untouched and all present is the client's own object, byte for byte); a changed one keeps
every field of its blocks but the new text, result or input (signatures, ids, ``cache_control``
and ``is_error`` untouched); new messages (the summary, notes) are text blocks, a new system
note joins ``system``. Consecutive messages of one role are merged (tool results first), and
the first message is always the user's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from policies.conversation import WIRE_ONLY, WIRE_TOKENS, Message

SYSTEM = -1  # the wire index of the neutral system message's source
IMAGE_TOKENS = 1600
PDF_TOKENS_PER_50KB = 2000
_IMAGE_BLOCKS = frozenset({"image", "document"})
_TOOL_RESULT = "tool_result"
_THINKING = frozenset({"thinking", "redacted_thinking"})
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
                parts.append(orjson.dumps(inner).decode())
        return "\n".join(parts), extra
    return orjson.dumps(content).decode(), 0


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
    return {"type": "text", "text": orjson.dumps(block).decode()}


def _call(block: dict[str, Any]) -> dict[str, Any]:
    arguments = block.get("input")
    return {
        "id": str(block.get("id") or ""),
        "type": "function",
        "function": {
            "name": block["name"] if isinstance(block.get("name"), str) else "",
            "arguments": orjson.dumps(arguments if arguments is not None else {}).decode(),
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
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            read.problem = read.problem or f"{where} must be an object with role user or assistant"
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
        if role == "assistant":
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
            calls.append(_call(block))
        elif kind == "thinking":
            read.thinking_blocks += 1
            if isinstance(block.get("thinking"), str):
                wire_only.append(block["thinking"])
        elif kind == "redacted_thinking":
            read.thinking_blocks += 1
        else:  # server tool blocks and any block this proxy does not know: counted as JSON
            read.server_blocks += 1
            wire_only.append(orjson.dumps(block).decode())
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
        if block["type"] != _TOOL_RESULT:
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


@dataclass(slots=True)
class _Piece:
    """One view message as wire blocks, before messages of one role are merged."""

    role: str
    blocks: list[Any]  # wire blocks, or a single string for string content
    source: int | None  # the wire message it came from, untouched (None: changed or new)
    origin_blocks: tuple[int, ...] = ()
    is_new: bool = False


@dataclass(slots=True)
class Rendered:
    messages: list[Any]
    system: Any
    # The end of the compacted prefix, where its cache breakpoint goes, and what it is
    # ("summary", "compacted_prefix", "note").
    cache_block: dict[str, Any] | None = None
    cache_block_kind: str = ""


def _replace_text(blocks: list[Any], text: str) -> list[Any]:
    """Blocks with their text blocks replaced by one holding ``text`` (at the first one's
    place, with its fields), every other block kept."""
    out: list[Any] = []
    placed = False
    for block in blocks:
        if isinstance(block, dict) and block.get("type") == "text":
            if not placed and text:
                out.append({**block, "text": text})
            placed = True
            continue
        out.append(block)
    if not placed and text:
        out.insert(0, {"type": "text", "text": text})
    return out


def _changed_blocks(message: Message, originals: list[Any]) -> list[Any]:
    role = message.get("role")
    if role == "tool":
        return [{**block, "content": text_of(message.get("content"))} for block in originals]
    if role == "assistant":
        unchanged = {_call(b)["function"]["arguments"] for b in originals if b.get("type") == "tool_use"}
        inputs = {}
        for call in message.get("tool_calls") or []:
            try:
                if call["function"]["arguments"] in unchanged:
                    continue
                arguments = orjson.loads(call["function"]["arguments"])
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue
            if isinstance(arguments, dict):
                inputs[call.get("id")] = arguments
        blocks = [
            {**b, "input": inputs[b.get("id")]}
            if b.get("type") == "tool_use" and b.get("id") in inputs
            else b
            for b in originals
        ]
        text = message.get("content")
        text = text if isinstance(text, str) else text_of(text)
        if text != text_of([b for b in originals if b.get("type") == "text"]):
            blocks = _replace_text(blocks, text)
        return blocks
    return _replace_text(originals, text_of(message.get("content")))


def _new_blocks(message: Message) -> list[Any]:
    text = text_of(message.get("content"))
    if message.get("role") == "tool":
        return [{"type": _TOOL_RESULT, "tool_use_id": message.get("tool_call_id"), "content": text}]
    blocks: list[Any] = [{"type": "text", "text": text}] if text else []
    for call in message.get("tool_calls") or []:
        block = {"type": "tool_use", "id": call.get("id"), "name": call["function"]["name"]}
        blocks.append({**block, "input": orjson.loads(call["function"]["arguments"] or "{}")})
    return blocks


def render(body: dict[str, Any], read: Read, view: Sequence[Message], origin: Sequence[int]) -> Rendered:
    wire: list[Any] = body["messages"]
    system = body.get("system")
    notes: list[str] = []
    pieces: list[_Piece] = []
    # The last block the policies wrote (a summary, a placeholder): the end of the compacted
    # prefix, where a cache breakpoint goes.
    marker: dict[str, Any] | None = None
    marked = ""
    for message, source in zip(view, origin, strict=True):
        role = "user" if message.get("role") == "tool" else str(message.get("role"))
        if source < 0:
            if role == "system":
                notes.append(text_of(message.get("content")))
                continue
            blocks = _new_blocks(message)
            if blocks:
                pieces.append(_Piece(role, blocks, None, is_new=True))
                marker, marked = blocks[-1], "summary" if role == "user" else "note"
            continue
        where = read.origins[source]
        if where.message == SYSTEM:
            if message is not read.messages[source]:
                system = text_of(message.get("content"))
            continue
        content = wire[where.message]["content"]
        if isinstance(content, str):
            if message is read.messages[source]:
                pieces.append(_Piece(role, [content], where.message))
            else:
                pieces.append(_Piece(role, [{"type": "text", "text": text_of(message.get("content"))}], None))
            continue
        originals = [content[i] for i in where.blocks]
        if message is read.messages[source]:
            pieces.append(_Piece(role, originals, where.message, where.blocks))
        else:
            changed = _changed_blocks(message, originals)
            pieces.append(_Piece(role, changed, None))
            ours = [
                b for b in changed if not any(b is o for o in originals) and b.get("type") not in _THINKING
            ]
            if ours:
                marker, marked = ours[-1], "compacted_prefix"
    if notes:
        system = _with_notes(system, notes)
    return Rendered(_merge(pieces, wire), system, marker, marked)


def _with_notes(system: Any, notes: list[str]) -> Any:
    if isinstance(system, list):
        return [*system, *({"type": "text", "text": note} for note in notes)]
    return "\n\n".join([system, *notes] if isinstance(system, str) and system else notes)


def _merge(pieces: list[_Piece], wire: list[Any]) -> list[Any]:
    groups: list[list[_Piece]] = []
    for piece in pieces:
        if groups and groups[-1][0].role == piece.role:
            groups[-1].append(piece)
        else:
            groups.append([piece])
    messages: list[Any] = []
    for group in groups:
        source = group[0].source
        if source is not None and all(p.source == source for p in group):
            original = wire[source]
            content = original["content"]
            whole = tuple(range(len(content))) if isinstance(content, list) else ()
            taken = sorted(i for p in group for i in p.origin_blocks)
            if tuple(taken) == whole:
                messages.append(original)  # the client's own message, byte for byte
                continue
        blocks: list[Any] = []
        for piece in group:
            blocks += [{"type": "text", "text": b} if isinstance(b, str) else b for b in piece.blocks]
        if group[0].role == "user":  # tool results first, as the API requires
            blocks.sort(key=lambda b: b.get("type") != _TOOL_RESULT)
        messages.append({"role": group[0].role, "content": blocks})
    if messages and messages[0].get("role") != "user":
        messages.insert(0, {"role": "user", "content": [{"type": "text", "text": OPENING}]})
    return messages
