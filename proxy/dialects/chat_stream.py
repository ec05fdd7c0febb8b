"""The Chat Completions event stream of one upstream round, as the client should see it:
text relayed at once (a round's first words held until it is known not to read), tool-call
deltas, the finishing chunk, usage and ``[DONE]`` held until the calls are known. Runs of
plain text and of argument deltas are recognized on the raw bytes of an upstream chunk and
relayed or merged without a parse per event, so 100,000 tiny deltas cost a few hundred writes.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from proxy.dialects.base import HELD_TEXT_CHARS
from proxy.dialects.chat_custom import neutral_message
from proxy.read_tool.tool import TOOL_NAME
from proxy.telemetry.shadow import decision_signature
from proxy.wire.response_writer import ResponseWriter
from proxy.wire.sse_framer import event_data

_NOT_PLAIN_TEXT = (b'"tool_calls"', b'"usage"', b'"error"', b'"function_call"')


def _plain_text(joined: bytes, count: int) -> bool:
    """``count`` one-line events joined by blank lines that can only be text to relay: each a
    ``data:`` line with ``"finish_reason":null`` and none of the keys that make an event more
    (tool calls, usage, an error). A JSON string cannot hold an unescaped quote or newline, so
    the keys and separators are counted on the joined bytes, at C speed; any other spelling is
    parsed as usual."""
    return (
        joined.startswith(b"data: ")
        and joined.count(b"\n") == 2 * (count - 1)
        and joined.count(b"\n\ndata: ") == count - 1
        and joined.count(b'"finish_reason":null') == count
        and not any(key in joined for key in _NOT_PLAIN_TEXT)
    )


def _as_stop(event: bytes) -> bytes:
    try:
        chunk = orjson.loads(event_data(event))
        chunk["choices"][0]["finish_reason"] = "stop"
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return event
    return b"data: " + orjson.dumps(chunk)


# One tool call's argument delta, as OpenAI spells it: the call's index and a piece of its
# arguments (a complete JSON string body, escapes included).
_ARGUMENT_DELTA = re.compile(
    rb'"delta":\{"tool_calls":\[\{"index":(\d+),"function":\{"arguments":"((?:[^"\\]|\\.)*)"\}\}\]\}'
)


def _argument_deltas(joined: bytes, count: int) -> list[tuple[bytes, bytes]] | None:
    """The (index, arguments) of ``count`` joined one-line events when each is nothing but an
    argument delta of an open call (``"finish_reason":null``, no text, usage or error); else
    None and the events are taken apart one by one."""
    if not (
        joined.startswith(b"data: ")
        and joined.count(b"\n") == 2 * (count - 1)
        and joined.count(b"\n\ndata: ") == count - 1
        and joined.count(b'"finish_reason":null') == count
        and joined.count(b'"tool_calls"') == count
        and not any(key in joined for key in (b'"usage"', b'"error"', b'"content":"', b'"function_call"'))
    ):
        return None
    found: list[tuple[bytes, bytes]] = _ARGUMENT_DELTA.findall(joined)
    return found if len(found) == count else None


def _text_of(part: str | bytes) -> str:
    """A text part, or the text of a chunk of plain text events relayed unparsed."""
    if isinstance(part, str):
        return part
    texts = []
    for event in part.split(b"\n\n"):
        try:
            content = orjson.loads(event[6:])["choices"][0]["delta"].get("content")
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
            continue
        if isinstance(content, str):
            texts.append(content)
    return "".join(texts)


class ChatStream:
    """One upstream SSE stream as the client should see it: text relayed at once, tool-call
    deltas, the finishing chunk, usage and ``[DONE]`` held until the calls are known. An empty
    opening delta (the role) is held too, so a round that only reads has sent nothing yet."""

    def __init__(self, writer: ResponseWriter) -> None:
        self.writer = writer
        self.held: list[bytes] = []
        self.closing: list[bytes] = []
        self.preamble: list[bytes] = []
        # Parts joined on demand: a round of 100,000 tiny deltas must not copy a growing string
        # 100,000 times. A bytes part is a chunk of text events relayed unparsed.
        self._text: list[str | bytes] = []
        self.usage: dict[str, Any] | None = None
        self.complete = False
        self.error: Any = None
        self._usage_event: dict[str, Any] | None = None
        self._calls: dict[int, dict[str, Any]] = {}
        self._call_parts: dict[int, tuple[list[str], list[str]]] = {}  # name, arguments
        self._custom: set[int] = set()  # the slots of custom tools' calls
        self._text_held: list[bytes] = []
        self._held_chars = 0
        self._streaming_text = False

    @property
    def text(self) -> str:
        if len(self._text) > 1 or (self._text and isinstance(self._text[0], bytes)):
            self._text = ["".join(_text_of(part) for part in self._text)]
        return str(self._text[0]) if self._text else ""

    async def take(self, event: bytes) -> None:
        data = event_data(event)
        if not data:
            return
        if data == b"[DONE]":
            self.complete = True
            return
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            await self._relay(event)
            return
        if isinstance(chunk, dict) and "error" in chunk and not chunk.get("choices"):
            self.error = chunk["error"]
            await self._relay(event)
            return
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        if isinstance(chunk, dict) and chunk.get("usage") and not choices:
            self.usage, self._usage_event = chunk["usage"], chunk
            return
        choice = choices[0] if isinstance(choices, list) and choices else None
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if isinstance(choice, dict) and isinstance(delta, dict) and delta.get("tool_calls"):
            for part in delta["tool_calls"]:
                if isinstance(part, dict):
                    self._merge(part)
            self.held.append(event)
            if not choice.get("finish_reason"):
                return
        if isinstance(choice, dict) and choice.get("finish_reason"):
            self.complete = True
            if isinstance(chunk.get("usage"), dict):
                self.usage = chunk["usage"]
            if not (isinstance(delta, dict) and delta.get("tool_calls")):
                self.closing.append(event)
            return
        content = delta.get("content") if isinstance(delta, dict) else None
        if isinstance(content, str):
            self._text.append(content)
        if not content and not self.writer.started:
            self.preamble.append(event)
            return
        if content and not self._streaming_text:
            # The first words of a round are held: a round that turns out to read saved outputs
            # ("Checking a saved output first.") never shows them, streamed or not, so clients
            # that parse the final text (structured output) see the same answer either way.
            self._text_held.append(event)
            self._held_chars += len(content)
            if self._held_chars <= HELD_TEXT_CHARS:
                return
            self._streaming_text = True
            held, self._text_held = self._text_held, []
            for early in held:
                await self._relay(early)
            return
        await self._relay(event)

    async def take_all(self, events: list[bytes]) -> None:
        """The events of one upstream chunk. Once the round's text streams, a chunk of plain
        text events is relayed as it is, in one write, and parsed later only if the round's
        text is needed: 100,000 tiny deltas must not cost a parse and a write each."""
        if events and (self._calls or (self._streaming_text and not self.preamble)):
            joined = b"\n\n".join(events)
            if self._streaming_text and not self.preamble and _plain_text(joined, len(events)):
                self._text.append(joined)  # its text is read from it if ever needed
                await self.writer.write(joined + b"\n\n")
                return
            arguments = _argument_deltas(joined, len(events)) if self._calls else None
            if arguments is not None and all(int(index) in self._calls for index, _ in arguments):
                self._add_arguments(arguments)
                self.held.append(joined)  # held as the events are, relayed when the round ends
                return
        for event in events:
            await self.take(event)

    def _add_arguments(self, arguments: list[tuple[bytes, bytes]]) -> None:
        """Argument pieces found in raw events: each call's pieces of the chunk decoded at once
        (pieces of JSON string bodies joined are one JSON string body)."""
        pieces: dict[int, list[bytes]] = {}
        for index, piece in arguments:
            pieces.setdefault(int(index), []).append(piece)
        for slot, parts in pieces.items():
            self._call_parts[slot][1].append(orjson.loads(b'"' + b"".join(parts) + b'"'))

    def _merge(self, part: dict[str, Any]) -> None:
        index = part.get("index", 0)
        slot = index if isinstance(index, int) else 0
        call = self._calls.setdefault(
            slot, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        names, arguments = self._call_parts.setdefault(slot, ([], []))
        if part.get("id"):
            call["id"] = part["id"]
        function = part.get("function")
        custom = part.get("custom")
        if isinstance(custom, dict):
            # A custom tool's call: its name and input pieces, kept as a function's until the
            # round's calls are asked for (``calls`` gives it its custom shape).
            self._custom.add(slot)
            function = {"name": custom.get("name"), "arguments": custom.get("input")}
        if isinstance(function, dict):
            names.append(function.get("name") or "")
            arguments.append(function.get("arguments") or "")

    def items(self) -> list[Any]:
        return []  # a chat round's calls and text are all ``add_round`` needs

    def calls(self) -> list[Any]:
        for slot, (names, arguments) in self._call_parts.items():
            function = self._calls[slot]["function"]
            function["name"] += "".join(names)
            function["arguments"] += "".join(arguments)
            names.clear()
            arguments.clear()
        return [
            _custom_shaped(self._calls[i]) if i in self._custom else self._calls[i]
            for i in sorted(self._calls)
        ]

    async def _relay(self, event: bytes) -> None:
        if self.preamble:
            held, self.preamble = self.preamble, []
            for early in held:
                await self.writer.write(early + b"\n\n")
        await self.writer.write(event + b"\n\n")

    def _without_internal(self) -> list[bytes]:
        """The held tool-call events without ``read_tool_output`` calls (the round limit was
        reached with the model still reading: never hand the agent an internal call)."""
        internal = {i for i, c in self._calls.items() if c["function"]["name"] == TOOL_NAME}
        if not internal:
            return self.held
        kept: list[bytes] = []
        for event in (one for held in self.held for one in held.split(b"\n\n")):
            chunk = orjson.loads(event_data(event))
            delta = chunk["choices"][0]["delta"]
            delta["tool_calls"] = [p for p in delta["tool_calls"] if p.get("index", 0) not in internal]
            if delta["tool_calls"] or chunk["choices"][0].get("finish_reason"):
                if not delta["tool_calls"]:
                    del delta["tool_calls"]
                    chunk["choices"][0]["finish_reason"] = "stop"
                kept.append(b"data: " + orjson.dumps(chunk))
        if len(internal) == len(self._calls):
            # Only reads were asked for: the answer ends as a plain stop.
            self.closing = [_as_stop(event) for event in self.closing]
        return kept

    async def finish(self, total_usage: dict[str, int]) -> None:
        # Everything held goes out in one write (100,000 held argument deltas are one send):
        # the held preamble first (as ``_relay`` sends it before any event), held text, the
        # calls, the closing chunk, the usage summed over the rounds, and the end.
        events = [*self.preamble, *self._text_held, *self._without_internal(), *self.closing]
        self.preamble = []
        if self._usage_event is not None:
            self._usage_event["usage"] = {**self._usage_event["usage"], **total_usage}
            events.append(b"data: " + orjson.dumps(self._usage_event))
        events.append(b"data: [DONE]")
        await self.writer.finish(b"\n\n".join(events) + b"\n\n")


def _custom_shaped(call: dict[str, Any]) -> dict[str, Any]:
    """A call gathered as a function's in its custom shape."""
    function = call["function"]
    return {
        "id": call["id"],
        "type": "custom",
        "custom": {"name": function["name"], "input": function["arguments"]},
    }


def message_from_json(raw: bytes) -> Any:
    try:
        data = orjson.loads(raw)
        return data["choices"][0]["message"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return None


def message_from_sse(raw: bytes) -> Any:
    """The assistant message a chat-completions SSE stream spelled out, delta by delta."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for line in raw.replace(b"\r\n", b"\n").split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if not data or data == b"[DONE]":
            continue
        try:
            chunk = orjson.loads(data)
            delta = chunk["choices"][0]["delta"]
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            continue
        if isinstance(delta.get("content"), str):
            content.append(delta["content"])
        for part in delta.get("tool_calls") or []:
            call = calls.setdefault(
                part.get("index", 0), {"type": "function", "function": {"name": "", "arguments": ""}}
            )
            function = part.get("function") or {}
            custom = part.get("custom")
            if isinstance(custom, dict):
                call["custom"] = True
                function = {"name": custom.get("name"), "arguments": custom.get("input")}
            call["function"]["name"] += function.get("name") or ""
            call["function"]["arguments"] += function.get("arguments") or ""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
    if calls:
        message["tool_calls"] = [
            _custom_shaped({"id": None, **c}) if c.pop("custom", False) else c
            for _, c in sorted(calls.items())
        ]
    return message


def chat_decision(raw: bytes, sse: bool) -> str:
    message = message_from_sse(raw) if sse else message_from_json(raw)
    return decision_signature(neutral_message(message))  # a custom call read as a call
