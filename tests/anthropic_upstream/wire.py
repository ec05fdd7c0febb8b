"""An answer on the wire, exactly as the Messages API writes it.

Non-streamed: the message object (``id`` ``msg_...``, ``type: message``, ``role``, ``model``,
``content``, ``stop_reason``, ``stop_sequence``, ``usage``). Streamed: ``message_start`` (the
message with empty content and the input usage), then per content block
``content_block_start`` (a ``ping`` after the first), its deltas (``thinking_delta`` pieces then
one ``signature_delta``; ``text_delta`` pieces; ``input_json_delta`` with ``partial_json`` in
several pieces, the first one empty as the API sends it; none for ``redacted_thinking``, whose
start carries its data) and ``content_block_stop``, then ``message_delta`` (``stop_reason``, the
cumulative usage: input, cache and output tokens) and ``message_stop``. Each event is
``event: <type>`` + ``data: {json}``.
"""

from __future__ import annotations

from typing import Any

import orjson


def pieces(text: str, count: int) -> list[str]:
    """``text`` split into about ``count`` pieces (none when empty)."""
    if not text:
        return []
    size = max(1, -(-len(text) // count))
    return [text[i : i + size] for i in range(0, len(text), size)]


def usage(input_tokens: int, read: int, creation: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": creation,
        "cache_read_input_tokens": read,
        "cache_creation": {"ephemeral_5m_input_tokens": creation, "ephemeral_1h_input_tokens": 0},
        "output_tokens": output_tokens,
        "service_tier": "standard",
    }


def stop_reason(content: list[dict[str, Any]]) -> str:
    return "tool_use" if any(b.get("type") == "tool_use" for b in content) else "end_turn"


def message(
    message_id: str, model: str, content: list[dict[str, Any]], use: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(content),
        "stop_sequence": None,
        "usage": use,
    }


def _event(payload: dict[str, Any]) -> bytes:
    return b"event: " + str(payload["type"]).encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def _block_events(index: int, block: dict[str, Any]) -> list[dict[str, Any]]:
    kind = block["type"]
    at = {"type": "content_block_delta", "index": index}
    start: dict[str, Any]
    if kind == "thinking":
        start = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [
            {**at, "delta": {"type": "thinking_delta", "thinking": p}} for p in pieces(block["thinking"], 3)
        ]
        deltas.append({**at, "delta": {"type": "signature_delta", "signature": block["signature"]}})
    elif kind == "text":
        start = {"type": "text", "text": ""}
        deltas = [{**at, "delta": {"type": "text_delta", "text": p}} for p in pieces(block["text"], 4)]
    elif kind == "tool_use":
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        arguments = orjson.dumps(block["input"]).decode()
        deltas = [
            {**at, "delta": {"type": "input_json_delta", "partial_json": p}}
            for p in ["", *pieces(arguments, 5)]
        ]
    else:  # redacted_thinking arrives whole in its start event
        start, deltas = block, []
    return [
        {"type": "content_block_start", "index": index, "content_block": start},
        *deltas,
        {"type": "content_block_stop", "index": index},
    ]


def events(message_id: str, model: str, content: list[dict[str, Any]], use: dict[str, Any]) -> list[bytes]:
    """The answer as the API streams it (one ``bytes`` per event)."""
    start_usage = {**use, "output_tokens": 1}
    payloads: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {**message(message_id, model, [], start_usage), "stop_reason": None},
        }
    ]
    for index, block in enumerate(content):
        block_events = _block_events(index, block)
        payloads.append(block_events[0])
        if index == 0:
            payloads.append({"type": "ping"})
        payloads.extend(block_events[1:])
    payloads.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason(content), "stop_sequence": None},
            # Cumulative, as the API now sends it: the input counts again, the final output count.
            "usage": {
                key: use[key]
                for key in (
                    "input_tokens",
                    "cache_creation_input_tokens",
                    "cache_read_input_tokens",
                    "output_tokens",
                )
            },
        }
    )
    payloads.append({"type": "message_stop"})
    return [_event(p) for p in payloads]


def error_event(body: dict[str, Any]) -> bytes:
    """A mid-stream error, as the API sends it (``event: error``, the error body without its
    request id)."""
    return _event({"type": "error", "error": body["error"]})
