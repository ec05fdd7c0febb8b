"""The Responses API's event stream, as the client should see it over several rounds.

Upstream, each round is a stream of typed events (``response.created``, ``.in_progress``,
``.output_item.added``, ``.content_part.added``, ``.output_text.delta``,
``.function_call_arguments.delta``, ``.output_item.done``, ..., ``response.completed``), each
with an ``output_index`` and a ``sequence_number``. The client must get one well-formed
stream: one ``response.created`` and ``in_progress`` (the first round's), the items of every
round renumbered in the order they reach it, ``sequence_number`` counting up, and one
``response.completed`` whose ``output`` lists exactly the items it was sent, with usage summed
over the rounds. Per item:

- text (``message`` items) is relayed as it arrives, once the round shows it is not a read
  round: a message's first ``HELD_TEXT_CHARS`` characters are held until the round ends or
  writes more, and a message followed by a ``read_tool_output`` call is dropped (the
  non-streamed answer drops a read round's text too, so a preamble such as "Checking a saved
  output first." reaches the client neither way);
- a ``reasoning`` item is held until the next item of its round starts: relayed with a message
  or a call of the agent's, dropped before a ``read_tool_output`` call (an API refuses a
  reasoning item replayed without the item that followed it);
- the agent's own calls are held until the round ends (a round that reads is asked again, and
  its calls are re-issued then); ``read_tool_output`` calls never reach the client.

A failure after the response started ends the stream with an ``error`` event, and no
``response.completed``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from proxy.dialects.held_parts import HeldParts
from proxy.wire.errors import ProxyError
from proxy.wire.response_writer import ResponseWriter
from proxy.wire.sse_framer import event_data, recorded_events, typed_event

_ROUND_EVENTS = frozenset({"response.created", "response.in_progress"})
_FINAL_EVENTS = frozenset({"response.completed", "response.incomplete"})
_CALLS = frozenset({"function_call", "custom_tool_call", "local_shell_call"})


def error_event(error: ProxyError) -> bytes:
    """A failure after the stream started, as the Responses API writes one (the SDKs raise)."""
    return typed_event(
        {"type": "error", "code": error.code or error.type, "message": error.message, "param": error.param}
    )


class _Item:
    """One output item of one round: its events while held, its fate, its client index."""

    def __init__(self, kind: str, read: bool) -> None:
        self.kind = kind
        self.read = read
        self.events: list[dict[str, Any]] = []
        self.done: dict[str, Any] | None = None  # the finished item
        self.index: int | None = None  # the client's output_index, once relayed


class ResponsesStream:
    """One round's stream. Rounds of one response share the client state (``Relay``) kept on the
    writer, so the second round's codec goes on numbering where the first stopped."""

    def __init__(self, writer: ResponseWriter, is_read_call: Callable[[Any], bool]) -> None:
        self.writer = writer
        self.is_read_call = is_read_call
        self.relay: Relay = writer.client_stream(Relay, lambda: Relay(writer))
        self._items: dict[int, _Item] = {}
        self._text: list[str] = []  # joined on demand (no quadratic copies)
        self.usage: dict[str, Any] | None = None
        self.complete = False
        self.error: Any = None
        self._completed: dict[str, Any] | None = None
        self._held: HeldParts[_Item] = HeldParts(self.relay.flush, keep_order=False)

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
        if kind in _ROUND_EVENTS:
            if not self.relay.opened:
                await self.relay.send(payload)
            return
        if kind == "error" or kind == "response.failed":
            self.error = payload
            await self.relay.send(payload)
            return
        if kind in _FINAL_EVENTS:
            self.complete = True
            response = payload.get("response")
            usage = response.get("usage") if isinstance(response, dict) else None
            self.usage = usage if isinstance(usage, dict) else None
            self._completed = payload
            return
        index = payload.get("output_index")
        if not isinstance(index, int):
            await self.relay.send(payload)
            return
        if kind == "response.output_item.added":
            added = payload.get("item")
            new = _Item(str(added.get("type")) if isinstance(added, dict) else "", self.is_read_call(added))
            self._items[index] = new
            self._started(new)
        item = self._items.get(index)
        if item is None:
            return
        if kind == "response.output_item.done" and isinstance(payload.get("item"), dict):
            item.done = payload["item"]
        if kind == "response.output_text.delta" and isinstance(payload.get("delta"), str):
            self._text.append(payload["delta"])
        if item.read:
            return
        if item.index is not None:
            await self.relay.send_item(item, payload)
            return
        item.events.append(payload)
        if kind == "response.output_text.delta":
            await self._held.text_added(item, len(payload.get("delta") or ""))

    def _started(self, item: _Item) -> None:
        """A new item decides the fate of what is held before it (``held_parts.py``)."""
        if item.kind == "reasoning":
            self._held.reasoning_started(item)
        elif item.read:
            self._held.read_started()
        elif item.kind == "message":
            self._held.text_started(item)
        else:
            self._held.other_started()

    def calls(self) -> list[Any]:
        return [i.done for _, i in sorted(self._items.items()) if i.kind in _CALLS and i.done is not None]

    def items(self) -> list[Any]:
        """The round's finished output items (reasoning, messages, calls), in order."""
        return [i.done for _, i in sorted(self._items.items()) if i.done is not None]

    async def finish(self, total_usage: dict[str, int]) -> None:
        """The last round: held reasoning and calls of the agent's, then one completion."""
        self.relay.writer.hold_writes()  # what was held goes out in one write
        for _, item in sorted(self._items.items()):
            if item.index is None and not item.read:
                await self.relay.flush(item)
        completed = self._completed or {"type": "response.completed", "response": {}}
        response = {**(completed.get("response") or {}), **self.relay.identity}
        response["output"] = self.relay.output
        if total_usage:
            usage = response.get("usage")
            response["usage"] = {**(usage if isinstance(usage, dict) else {}), **total_usage}
        await self.relay.send({**completed, "response": response}, last=True)

    @staticmethod
    def output_of(raw: bytes) -> list[Any]:
        """The output items a recorded stream ended with (for shadow comparisons)."""
        for event in reversed(recorded_events(raw)):
            try:
                payload = orjson.loads(event_data(event))
            except orjson.JSONDecodeError:
                continue
            if isinstance(payload, dict) and payload.get("type") in _FINAL_EVENTS:
                output = (payload.get("response") or {}).get("output")
                return output if isinstance(output, list) else []
        return []


class Relay:
    """What the client has been sent so far, over every round of one response."""

    def __init__(self, writer: ResponseWriter) -> None:
        self.writer = writer
        self.opened = False
        self.sequence = 0
        self.next_index = 0
        self.items: list[_Item] = []
        # The first round's created/in_progress events: held until there is something to send,
        # so a round that only reads has sent nothing, and a failure after it keeps its status.
        self.preamble: list[dict[str, Any]] = []
        # The first round's response id and creation time: the client sees one response.
        self.identity: dict[str, Any] = {}
        writer.use_error_event(self.failure_events)

    @property
    def output(self) -> list[Any]:
        return [i.done for i in self.items if i.done is not None]

    def assign(self, item: _Item) -> None:
        item.index = self.next_index
        self.next_index += 1
        self.items.append(item)

    async def flush(self, item: _Item) -> None:
        if item.index is None:
            self.assign(item)
        held, item.events = item.events, []
        for payload in held:
            await self.send_item(item, payload)

    async def send_item(self, item: _Item, payload: dict[str, Any]) -> None:
        await self.send({**payload, "output_index": item.index})

    def failure_events(self, error: ProxyError) -> bytes:
        """A failure after the stream started: the ``error`` event, then ``response.failed`` for
        the response the client has been receiving (Codex shows its message), no completion."""
        held, self.preamble = self.preamble, []
        failed = {
            **(held[0].get("response") or {} if held else {}),
            **self.identity,
            "status": "failed",
            "error": {"code": error.code or error.type, "message": error.message},
            "output": self.output,
        }
        events = [
            *held,
            {
                "type": "error",
                "code": error.code or error.type,
                "message": error.message,
                "param": error.param,
            },
            {"type": "response.failed", "response": failed},
        ]
        chunks = []
        for payload in events:
            chunks.append(typed_event({**payload, "sequence_number": self.sequence}))
            self.sequence += 1
        return b"".join(chunks)

    async def send(self, payload: dict[str, Any], *, last: bool = False) -> None:
        if payload.get("type") in _ROUND_EVENTS:
            response = payload.get("response")
            if not self.identity and isinstance(response, dict):
                self.identity = {k: response[k] for k in ("id", "created_at") if k in response}
            self.opened = True
            self.preamble.append(payload)
            return
        held, self.preamble = self.preamble, []
        for early in held:
            await self._write(early, last=False)
        await self._write(payload, last=last)

    async def _write(self, payload: dict[str, Any], *, last: bool) -> None:
        payload = {**payload, "sequence_number": self.sequence}
        self.sequence += 1
        if last:
            await self.writer.finish(typed_event(payload))
        else:
            await self.writer.write(typed_event(payload))
