"""A view written back as an Anthropic Messages body.

Writing (``render``) groups the view's messages back into alternating wire messages: a
message the policies did not touch is its original blocks (a wire message whose pieces are all
untouched and all present is the client's own object, byte for byte); a changed one keeps
every field of its blocks but the new text, result or input (signatures, ids, ``cache_control``
and ``is_error`` untouched); new messages (the summary, notes) are text blocks, a new system
note joins ``system``. Consecutive messages of one role are merged (tool results first), but
for system messages inside ``messages``, each of which goes as the client's own object; and
the first message is always the user's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from policies.conversation import Message
from proxy.dialects.anthropic_messages import (
    OPENING,
    SYSTEM,
    THINKING_BLOCKS,
    TOOL_RESULT,
    Read,
    neutral_call,
    text_of,
)
from proxy.wire.json_body import json_value


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
        unchanged = {
            neutral_call(b)["function"]["arguments"] for b in originals if b.get("type") == "tool_use"
        }
        inputs = {}
        for call in message.get("tool_calls") or []:
            try:
                if call["function"]["arguments"] in unchanged:
                    continue
                arguments = json_value(call["function"]["arguments"])
            except (ValueError, KeyError, TypeError):
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
        return [{"type": TOOL_RESULT, "tool_use_id": message.get("tool_call_id"), "content": text}]
    blocks: list[Any] = [{"type": "text", "text": text}] if text else []
    for call in message.get("tool_calls") or []:
        block = {"type": "tool_use", "id": call.get("id"), "name": call["function"]["name"]}
        blocks.append({**block, "input": json_value(call["function"]["arguments"] or "{}")})
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
                b
                for b in changed
                if not any(b is o for o in originals) and b.get("type") not in THINKING_BLOCKS
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


def _joins(group: list[_Piece], piece: _Piece) -> bool:
    """Whether ``piece`` joins the wire message of ``group``: one of the same role, but for a
    system message the client itself sent right after another (each goes as sent); two that
    only a compaction brought together (what was between them summarized or cut) are joined,
    as the API wants no two messages of one role in a row."""
    last = group[-1]
    if last.role != piece.role:
        return False
    if piece.role != "system":
        return True
    return last.source is None or piece.source is None or piece.source != last.source + 1


def _merge(pieces: list[_Piece], wire: list[Any]) -> list[Any]:
    groups: list[list[_Piece]] = []
    for piece in pieces:
        if groups and _joins(groups[-1], piece):
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
            blocks.sort(key=lambda b: b.get("type") != TOOL_RESULT)
        messages.append({"role": group[0].role, "content": blocks})
    if messages and messages[0].get("role") != "user":
        messages.insert(0, {"role": "user", "content": [{"type": "text", "text": OPENING}]})
    return messages
