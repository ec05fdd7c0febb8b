"""Anthropic's Messages event stream, as the client should see it over several rounds.

Upstream, each round is ``message_start``, then per content block ``content_block_start``,
``content_block_delta`` (``text_delta``, ``input_json_delta``, ``thinking_delta``,
``signature_delta``, ``citations_delta``) and ``content_block_stop``, with ``ping`` anywhere,
then ``message_delta`` (``stop_reason``, usage) and ``message_stop``. The client must get one
well-formed stream: the first round's ``message_start`` (held until something follows it, so a
round that only reads has sent nothing and a failure can still get a real status), every
relayed block renumbered in the order it reaches the client, and one ``message_delta`` (the
last round's, usage summed over the rounds) and ``message_stop``. Per block:

- text is relayed as it arrives, once the round shows it is not a read round: a text block's
  first ``HELD_TEXT_CHARS`` characters are held until the round ends or writes more, and a
  text followed by a ``read_tool_output`` call is dropped (the non-streamed answer drops a read
  round's text too, so a preamble reaches the client neither way);
- a thinking block is held until the next block starts: relayed with text, dropped before a
  ``read_tool_output`` call (it goes back upstream with the read), and kept with an agent's
  ``tool_use`` that follows it;
- the agent's own ``tool_use`` (and server tool blocks) are held until the round ends: a round
  that reads is asked again and its calls are re-issued then; ``read_tool_output`` calls never
  reach the client.

A failure after the response started ends the stream with an ``error`` event (as Anthropic's
own overloaded errors do) and no ``message_stop``, so the SDKs raise.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson

from proxy.dialects.held_parts import HeldParts
from proxy.wire.errors import ProxyError, anthropic_error_body
from proxy.wire.response_writer import ResponseWriter
from proxy.wire.sse_framer import event_data, recorded_events, typed_event

_USAGE_KEYS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
_HELD_WITH_NEXT = frozenset({"thinking", "redacted_thinking"})
# Before anything reached the client, an upstream ping is relayed only after this long.
PING_AFTER_SECONDS = 10.0


def error_event(error: ProxyError) -> bytes:
    return b"event: error\ndata: " + anthropic_error_body(error) + b"\n\n"


class _Block:
    """One content block of one round: its events while held, its content, its client index."""

    def __init__(self, start: dict[str, Any], read: bool) -> None:
        self.kind = str(start.get("type"))
        self.read = read
        self.data = dict(start)
        # Deltas kept as parts and joined once, when the block finishes (no quadratic copies).
        self.json_parts: list[str] = []  # input_json_delta parts
        self._parts: dict[str, list[str]] = {"text": [], "thinking": []}
        self.events: list[dict[str, Any]] = []
        self.done = False
        self.index: int | None = None  # the client's index, once relayed

    def add(self, delta: dict[str, Any]) -> str:
        """Apply a delta; the text it adds, if any."""
        kind = delta.get("type")
        if kind == "text_delta" and isinstance(delta.get("text"), str):
            self._parts["text"].append(delta["text"])
            return str(delta["text"])
        if kind == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            self.json_parts.append(delta["partial_json"])
        elif kind == "thinking_delta" and isinstance(delta.get("thinking"), str):
            self._parts["thinking"].append(delta["thinking"])
        elif kind == "signature_delta" and isinstance(delta.get("signature"), str):
            self.data["signature"] = delta["signature"]
        elif kind == "citations_delta" and isinstance(delta.get("citation"), dict):
            citations = self.data.get("citations")
            # A text block may open with ``"citations": null``.
            if not isinstance(citations, list):
                citations = self.data["citations"] = []
            citations.append(delta["citation"])
        return ""

    def finish(self) -> None:
        self.done = True
        for key, parts in self._parts.items():
            if parts:
                self.data[key] = str(self.data.get(key) or "") + "".join(parts)
                parts.clear()
        if self.json_parts:
            try:
                self.data["input"] = orjson.loads("".join(self.json_parts))
            except orjson.JSONDecodeError:
                self.data["input"] = {}


class AnthropicStream:
    """One round's stream. Rounds of one response share the client state (``Relay``) kept on the
    writer, so the second round's codec goes on numbering where the first stopped."""

    def __init__(self, writer: ResponseWriter, is_read_call: Callable[[Any], bool]) -> None:
        self.is_read_call = is_read_call
        self.relay: Relay = writer.client_stream(Relay, lambda: Relay(writer))
        self.blocks: dict[int, _Block] = {}
        self._text: list[str] = []  # joined on demand (no quadratic copies)
        self.usage: dict[str, Any] | None = None
        self.complete = False
        self.error: Any = None
        self._delta: dict[str, Any] | None = None
        self._held: HeldParts[_Block] = HeldParts(self.relay.flush, keep_order=True)

    @property
    def text(self) -> str:
        """The round's text so far (parts joined once per read)."""
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
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if not isinstance(payload, dict):
            return
        kind = payload.get("type")
        if kind == "message_start":
            message = payload.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            self.usage = dict(usage) if isinstance(usage, dict) else {}
            self.relay.open(payload)
            return
        if kind == "ping":
            # Relayed once the client has bytes; before that, only when the round has been
            # silent for a while (a long held thinking block), so no intermediary times out.
            if self.relay.writer.started or self.relay.waited() > PING_AFTER_SECONDS:
                await self.relay.send(payload)
            return
        if kind == "error":
            self.error = payload
            await self.relay.send(payload)
            return
        if kind == "message_delta":
            self._delta = payload
            usage = payload.get("usage")
            if isinstance(usage, dict):
                self.usage = {**(self.usage or {}), **{k: v for k, v in usage.items() if v is not None}}
            return
        if kind == "message_stop":
            self.complete = True
            return
        index = payload.get("index")
        if not isinstance(index, int):
            return
        if kind == "content_block_start" and isinstance(payload.get("content_block"), dict):
            started = _Block(payload["content_block"], self.is_read_call(payload["content_block"]))
            self.blocks[index] = started
            self._started(started)
        block = self.blocks.get(index)
        if block is None:
            return
        added = ""
        if kind == "content_block_delta" and isinstance(payload.get("delta"), dict):
            added = block.add(payload["delta"])
            self._text.append(added)
        elif kind == "content_block_stop":
            block.finish()
        if block.read:
            return
        if block.index is not None:
            await self.relay.send_block(block, payload)
            return
        block.events.append(payload)
        if added:
            await self._held.text_added(block, len(added))

    def _started(self, block: _Block) -> None:
        """A new block decides the fate of what is held before it (``held_parts.py``)."""
        if block.kind in _HELD_WITH_NEXT:
            self._held.reasoning_started(block)
        elif block.read:
            self._held.read_started()
        elif block.kind == "text":
            self._held.text_started(block)
        else:
            self._held.other_started()

    def calls(self) -> list[Any]:
        return [b.data for _, b in sorted(self.blocks.items()) if b.kind == "tool_use" and b.done]

    def items(self) -> list[Any]:
        return [b.data for _, b in sorted(self.blocks.items()) if b.done]

    async def finish(self, total_usage: dict[str, int]) -> None:
        """The last round: held blocks of the agent's in order, then one delta and the stop."""
        self.relay.writer.hold_writes()  # what was held goes out in one write
        for _, block in sorted(self.blocks.items()):
            if block.index is None and not block.read:
                await self.relay.flush(block)
        delta = dict(self._delta or {"type": "message_delta", "delta": {"stop_reason": "end_turn"}})
        if not any(b.kind == "tool_use" and not b.read for b in self.blocks.values()):
            inner = dict(delta.get("delta") or {})
            if inner.get("stop_reason") == "tool_use":  # only reads were asked for
                delta["delta"] = {**inner, "stop_reason": "end_turn"}
        if total_usage:
            usage = delta.get("usage")
            delta["usage"] = {**(usage if isinstance(usage, dict) else {}), **total_usage}
        await self.relay.send(delta)
        await self.relay.send({"type": "message_stop"}, last=True)


class Relay:
    """What the client has been sent so far, over every round of one response."""

    def __init__(self, writer: ResponseWriter) -> None:
        self.writer = writer
        self.opened = False
        self.opened_at = 0.0
        self.next_index = 0
        # The first round's message_start, held until there is something to send after it.
        self.preamble: list[dict[str, Any]] = []

    def open(self, payload: dict[str, Any]) -> None:
        if not self.opened:
            self.opened = True
            self.opened_at = time.monotonic()
            self.preamble.append(payload)

    def waited(self) -> float:
        return time.monotonic() - self.opened_at if self.opened else 0.0

    def assign(self, block: _Block) -> None:
        block.index = self.next_index
        self.next_index += 1

    async def flush(self, block: _Block) -> None:
        if block.index is None:
            self.assign(block)
        held, block.events = block.events, []
        for payload in held:
            await self.send_block(block, payload)

    async def send_block(self, block: _Block, payload: dict[str, Any]) -> None:
        await self.send({**payload, "index": block.index})

    async def send(self, payload: dict[str, Any], *, last: bool = False) -> None:
        held, self.preamble = self.preamble, []
        for early in held:
            await self.writer.write(typed_event(early))
        if last:
            await self.writer.finish(typed_event(payload))
        else:
            await self.writer.write(typed_event(payload))


def blocks_of_stream(raw: bytes) -> list[dict[str, Any]]:
    """The content blocks a recorded stream spelled out (for shadow comparisons)."""
    blocks: dict[int, _Block] = {}
    for event in recorded_events(raw):
        try:
            payload = orjson.loads(event_data(event))
        except orjson.JSONDecodeError:
            continue
        if not isinstance(payload, dict) or not isinstance(payload.get("index"), int):
            continue
        kind, index = payload.get("type"), payload["index"]
        if kind == "content_block_start" and isinstance(payload.get("content_block"), dict):
            blocks[index] = _Block(payload["content_block"], False)
        elif index in blocks and kind == "content_block_delta" and isinstance(payload.get("delta"), dict):
            blocks[index].add(payload["delta"])
        elif index in blocks and kind == "content_block_stop":
            blocks[index].finish()
    return [b.data for _, b in sorted(blocks.items())]
