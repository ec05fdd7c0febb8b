"""A view written back as a Gemini ``generateContent`` body.

Writing (``render``) turns the view's messages back into ``contents``: a message the policies did
not touch is its original parts (a content whose parts are all untouched and all present is the
client's own object, byte for byte); a changed one keeps every part and every field of its parts
but the new text, ``args`` or ``response`` (``thoughtSignature``, thought parts, ids and media
untouched); new messages (the summary, notes) are text parts, a new system note joins
``systemInstruction``. The pieces of one content (a user content's results and its text) go
back as one content, so a ``functionResponse`` content still answers the ``functionCall``
content before it, part for part; the first content is always the user's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from policies.conversation import Message, message_text
from proxy.dialects.gemini_contents import (
    CALL_PREFIX,
    OPENING,
    SYSTEM,
    Read,
    field,
    key_of,
)
from proxy.wire.json_body import json_value


@dataclass(slots=True)
class _Piece:
    """One view message as wire parts, before the pieces of one content are joined."""

    role: str  # the neutral role
    parts: list[Any]
    source: int | None  # the content it came from (None: new)
    taken: tuple[int, ...] = ()  # its parts' places there, when untouched
    untouched: bool = False


def wire_role(role: str) -> str:
    return "model" if role == "assistant" else "user"


def _signed(part: dict[str, Any]) -> bool:
    return field(part, "thoughtSignature") is not None


def replace_text(parts: list[Any], text: str) -> list[Any]:
    """Parts with their (non-thought) text parts replaced by one holding ``text``, at the first
    one's place with its fields; a later text part that carries a signature keeps it, emptied."""
    out: list[Any] = []
    placed = False
    for part in parts:
        if isinstance(part, dict) and isinstance(part.get("text"), str) and not part.get("thought"):
            if not placed and (text or _signed(part)):
                out.append({**part, "text": text})
            elif _signed(part):
                out.append({**part, "text": ""})
            placed = True
            continue
        out.append(part)
    if not placed and text:
        out.insert(0, {"text": text})
    return out


def new_response(original: Any, text: str) -> dict[str, Any]:
    """A function response that says ``text``, in the shape of the one it replaces."""
    if isinstance(original, dict) and len(original) == 1:
        (name, value), *_ = original.items()
        if isinstance(value, str):
            return {name: text}
    return {"output": text}


def _changed_model(message: Message, original: Message, parts: list[Any]) -> list[Any]:
    ids = [c["id"] for c in original.get("tool_calls") or []]
    before = {c["id"]: c["function"]["arguments"] for c in original.get("tool_calls") or []}
    after: dict[str, Any] = {}
    for call in message.get("tool_calls") or []:
        try:
            if call["function"]["arguments"] == before.get(call.get("id")):
                continue
            arguments = json_value(call["function"]["arguments"])
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(arguments, dict):
            after[call.get("id")] = arguments
    out: list[Any] = []
    calls = 0
    for part in parts:
        if field(part, "functionCall") is not None:
            call_id = ids[calls] if calls < len(ids) else None
            calls += 1
            if call_id in after:
                key = key_of(part, "functionCall")
                part = {**part, key: {**part[key], "args": after[call_id]}}
        out.append(part)
    text = message_text(message)
    if text != message_text(original):
        out = replace_text(out, text)
    return out


def _changed_parts(message: Message, original: Message, parts: list[Any]) -> list[Any]:
    role = message.get("role")
    if role == "tool":
        text = message_text(message)
        out = []
        for part in parts:
            key = key_of(part, "functionResponse")
            answer = part[key]
            out.append({**part, key: {**answer, "response": new_response(answer.get("response"), text)}})
        return out
    if role == "assistant":
        return _changed_model(message, original, parts)
    return replace_text(parts, message_text(message))


def _new_parts(message: Message) -> list[Any]:
    text = message_text(message)
    if message.get("role") == "tool":
        answer: dict[str, Any] = {"name": str(message.get("name") or ""), "response": {"output": text}}
        call_id = message.get("tool_call_id")
        if isinstance(call_id, str) and call_id and not call_id.startswith(CALL_PREFIX):
            answer["id"] = call_id
        return [{"functionResponse": answer}]
    parts: list[Any] = [{"text": text}] if text else []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        made = {"name": function.get("name"), "args": json_value(function.get("arguments") or "{}")}
        if isinstance(call.get("id"), str) and not call["id"].startswith(CALL_PREFIX):
            made["id"] = call["id"]
        parts.append({"functionCall": made})
    return parts


@dataclass(slots=True)
class Rendered:
    contents: list[Any]
    system: Any  # the systemInstruction to send (the client's own object when untouched)


def render(body: dict[str, Any], read: Read, view: Sequence[Message], origin: Sequence[int]) -> Rendered:
    wire: list[Any] = body["contents"]
    system = field(body, "systemInstruction")
    notes: list[str] = []
    pieces: list[_Piece] = []
    for message, source in zip(view, origin, strict=True):
        role = str(message.get("role"))
        if source < 0:
            if role in ("system", "developer"):
                notes.append(message_text(message))
            elif parts := _new_parts(message):
                pieces.append(_Piece(role, parts, None))
            continue
        where = read.origins[source]
        if where.content == SYSTEM:
            if message is not read.messages[source]:
                system = _system_with(system, [message_text(message)], replace=True)
            continue
        parts = [wire[where.content]["parts"][i] for i in where.parts]
        if message is read.messages[source]:
            pieces.append(_Piece(role, parts, where.content, where.parts, untouched=True))
        else:
            changed = _changed_parts(message, read.messages[source], parts)
            pieces.append(_Piece(role, changed, where.content))
    if notes:
        system = _system_with(system, notes, replace=False)
    return Rendered(_join(pieces, wire), system)


def _system_with(system: Any, texts: list[str], *, replace: bool) -> Any:
    added = [{"text": t} for t in texts if t]
    if isinstance(system, str):
        system = {"parts": [{"text": system}]}
    if not isinstance(system, dict):
        return {"parts": added}
    kept = [] if replace else [p for p in system.get("parts") or []]
    return {**system, "parts": [*kept, *added]}


def _joins(group: list[_Piece], piece: _Piece) -> bool:
    """Whether ``piece`` goes in the content of ``group``: the same content's pieces, and a new
    result after the results it follows."""
    last = group[-1]
    if piece.source is not None:
        return last.source == piece.source
    return piece.role == "tool" and last.role == "tool"


def _join(pieces: list[_Piece], wire: list[Any]) -> list[Any]:
    groups: list[list[_Piece]] = []
    for piece in pieces:
        if groups and _joins(groups[-1], piece):
            groups[-1].append(piece)
        else:
            groups.append([piece])
    contents: list[Any] = []
    for group in groups:
        source = group[0].source
        if source is not None and all(p.untouched for p in group):
            original = wire[source]
            taken = sorted(i for p in group for i in p.taken)
            if taken == list(range(len(original["parts"]))):
                contents.append(original)  # the client's own content, byte for byte
                continue
        parts = [part for piece in group for part in piece.parts]
        if not parts:
            continue
        if source is not None:
            contents.append({**wire[source], "parts": parts})
        else:
            contents.append({"role": wire_role(group[0].role), "parts": parts})
    if contents and contents[0].get("role") == "model":
        contents.insert(0, {"role": "user", "parts": [{"text": OPENING}]})
    return contents
