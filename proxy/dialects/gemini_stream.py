"""Gemini's event stream (``:streamGenerateContent?alt=sse``), as the client should see it over
several rounds.

Upstream, a round is a run of ``data: {GenerateContentResponse}`` events, each holding the next
parts of ``candidates[0].content.parts`` (text in pieces, each ``functionCall`` whole, thought
parts with ``thought: true``, a ``thoughtSignature`` on the part it belongs to), the usage so
far in ``usageMetadata``, and ``finishReason`` in the last; there is no end marker. A mid-stream
failure is an event ``{"error": {"code", "message", "status"}}``, which Google's SDKs raise.

The client gets one stream: per upstream event, the parts it may see now; the last event holds
what was held, the last round's ``finishReason`` and the usage summed over the rounds.
Parts are grouped as the other doors group blocks (``held_parts.py``): a run of text parts is a
text, a run of thought parts is reasoning (held until the next part starts, and then sharing
its fate), each call is one part.

- the round's first text is held until the round ends or writes more than ``HELD_TEXT_CHARS``
  characters, and a text followed by a ``read_tool_output`` call is dropped (with the thoughts
  before it): it goes back upstream with the read, never to the client;
- the agent's own calls (and any other part) are held to the round's end, and every part after
  them too, so the client gets the parts in the model's order; ``read_tool_output`` calls never
  reach the client.

Code Assist wraps each event's response as ``{"response": {...}}``: the codec is told the
``envelope`` and keeps it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from proxy.dialects.gemini_contents import field
from proxy.dialects.held_parts import HeldParts
from proxy.wire.errors import ProxyError, google_error_body
from proxy.wire.response_writer import ResponseWriter
from proxy.wire.sse_framer import event_data, recorded_events

_END = b"\n\n"
_PROMPT_KEYS = ("promptTokenCount", "cachedContentTokenCount", "toolUsePromptTokenCount")
_OUTPUT_KEYS = ("candidatesTokenCount", "thoughtsTokenCount")


def error_event(error: ProxyError) -> bytes:
    return b"data: " + google_error_body(error) + _END


def sse_event(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + _END


def part_kind(part: dict[str, Any]) -> str:
    if field(part, "functionCall") is not None:
        return "call"
    if isinstance(part.get("text"), str):
        return "thought" if part.get("thought") else "text"
    return "other"


def merged_parts(parts: list[Any]) -> list[Any]:
    """Streamed parts as one answer's: consecutive plain text pieces (no signature, no other
    field) joined, thoughts with thoughts; every other part as it came."""
    out: list[Any] = []
    for part in parts:
        previous = out[-1] if out else None
        if (
            isinstance(previous, dict)
            and isinstance(part, dict)
            and set(part) <= {"text", "thought"}
            and set(previous) <= {"text", "thought"}
            and isinstance(part.get("text"), str)
            and isinstance(previous.get("text"), str)
            and bool(part.get("thought")) == bool(previous.get("thought"))
        ):
            out[-1] = {**previous, "text": previous["text"] + part["text"]}
        else:
            out.append(part)
    return out


def add_usage(total: dict[str, int], usage: Any) -> None:
    """The last round's prompt figures (an agent reads them as its context size) and the output
    of every round, thoughts included; ``totalTokenCount`` their sum."""
    if not isinstance(usage, dict):
        return
    for key in _PROMPT_KEYS:
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            total[key] = value
    for key in _OUTPUT_KEYS:
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            total[key] = total.get(key, 0) + value
    # The prompt count holds its cached tokens; tool-use prompts and thoughts come on top.
    parts = ("promptTokenCount", "toolUsePromptTokenCount", *_OUTPUT_KEYS)
    total["totalTokenCount"] = sum(total.get(k, 0) for k in parts)


class _Block:
    """A run of one round's parts: a text, a reasoning, a call or another part."""

    def __init__(self, kind: str, read: bool) -> None:
        self.kind = kind
        self.read = read
        self.parts: list[dict[str, Any]] = []
        self.unsent: list[dict[str, Any]] = []
        self.relayed = False  # flushed: its parts go out as they come


class GeminiStream:
    """One round's stream (rounds share nothing the client has seen but the writer)."""

    def __init__(
        self, writer: ResponseWriter, is_read_call: Callable[[Any], bool], envelope: str | None = None
    ) -> None:
        self.writer = writer
        self.is_read_call = is_read_call
        self.envelope = envelope
        self.blocks: list[_Block] = []
        self._text: list[str] = []
        self.usage: dict[str, Any] | None = None
        self.complete = False
        self.error: Any = None
        self._held: HeldParts[_Block] = HeldParts(self._flush, keep_order=True)
        self._out: list[dict[str, Any]] = []  # parts that go out with the event being read
        self._outer: dict[str, Any] = {}  # the last event (its envelope, if any)
        self._chunk: dict[str, Any] = {}  # the last response
        self._candidate: dict[str, Any] = {}  # the last candidate's fields but its content

    @property
    def text(self) -> str:
        if len(self._text) > 1:
            self._text = ["".join(self._text)]
        return self._text[0] if self._text else ""

    async def take_all(self, events: list[bytes]) -> None:
        for event in events:
            await self.take(event)

    async def take(self, event: bytes) -> None:
        data = event_data(event)
        if not data:
            return
        try:
            outer = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if not isinstance(outer, dict):
            return
        if "error" in outer:
            self.error = outer
            await self.writer.write(sse_event(outer))
            return
        chunk = outer.get(self.envelope) if self.envelope else outer
        if not isinstance(chunk, dict):
            return
        self._outer, self._chunk = outer, chunk
        usage = field(chunk, "usageMetadata")
        if isinstance(usage, dict):
            self.usage = usage
        candidates = chunk.get("candidates")
        candidate = candidates[0] if isinstance(candidates, list) and candidates else None
        if isinstance(candidate, dict):
            self._candidate = {k: v for k, v in candidate.items() if k != "content"}
            if field(candidate, "finishReason"):
                self.complete = True
            content = candidate.get("content")
            parts = content.get("parts") if isinstance(content, dict) else None
            for part in parts if isinstance(parts, list) else []:
                if isinstance(part, dict):
                    await self._part(part)
        elif isinstance(chunk.get("promptFeedback"), dict):
            self.complete = True  # the prompt was blocked: this is the whole answer
        if self._out:
            parts, self._out = self._out, []
            await self.writer.write(sse_event(self._frame(parts, final=None)))

    async def _part(self, part: dict[str, Any]) -> None:
        kind = part_kind(part)
        current = self.blocks[-1] if self.blocks else None
        if current is None or kind not in ("text", "thought") or current.kind != kind:
            current = _Block(kind, kind == "call" and self.is_read_call(part))
            self.blocks.append(current)
            self._started(current)
        current.parts.append(part)
        if kind == "text":
            self._text.append(part["text"])
        if current.read:
            return
        if current.relayed:
            self._out.append(part)
            return
        current.unsent.append(part)
        if kind == "text":
            await self._held.text_added(current, len(part["text"]))

    def _started(self, block: _Block) -> None:
        """A new block decides the fate of what is held before it (``held_parts.py``)."""
        if block.kind == "thought":
            self._held.reasoning_started(block)
        elif block.read:
            self._held.read_started()
        elif block.kind == "text":
            self._held.text_started(block)
        else:
            self._held.other_started()

    async def _flush(self, block: _Block) -> None:
        self._out += block.unsent
        block.unsent = []
        block.relayed = True

    def _frame(self, parts: list[dict[str, Any]], final: dict[str, int] | None) -> dict[str, Any]:
        """An event for the client: ``parts`` in the upstream's last response's frame; the last
        one (``final``: the usage summed) with the finish reason and the usage."""
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        chunk = {
            k: v for k, v in self._chunk.items() if k not in ("candidates", "usageMetadata", "usage_metadata")
        }
        if final is not None:
            candidate = {**self._candidate, **candidate}
            candidate.setdefault("finishReason", "STOP")
            usage = self.usage or {}
            if usage or final:
                chunk["usageMetadata"] = {**usage, **final}
        chunk["candidates"] = [candidate]
        if not self.envelope:
            return chunk
        return {**self._outer, self.envelope: chunk}

    def calls(self) -> list[Any]:
        return [b.parts[0] for b in self.blocks if b.kind == "call"]

    def items(self) -> list[Any]:
        return merged_parts([p for b in self.blocks for p in b.parts])

    async def finish(self, total_usage: dict[str, int]) -> None:
        """The last round: what was held, in order, with the finish reason and the usage."""
        held = [p for b in self.blocks if not b.read for p in b.unsent]
        await self.writer.finish(sse_event(self._frame(held, final=total_usage)))


def parts_of_stream(raw: bytes, envelope: str | None = None) -> list[Any]:
    """The parts a recorded stream spelled out (for shadow comparisons)."""
    parts: list[Any] = []
    for event in recorded_events(raw):
        try:
            outer = orjson.loads(event_data(event))
        except orjson.JSONDecodeError:
            continue
        chunk = outer.get(envelope) if envelope and isinstance(outer, dict) else outer
        candidates = chunk.get("candidates") if isinstance(chunk, dict) else None
        candidate = candidates[0] if isinstance(candidates, list) and candidates else None
        content = candidate.get("content") if isinstance(candidate, dict) else None
        found = content.get("parts") if isinstance(content, dict) else None
        parts += found if isinstance(found, list) else []
    return merged_parts(parts)
