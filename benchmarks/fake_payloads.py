"""The fake upstream's answers, built once as bytes: a Chat Completions completion and its SSE
chunks, an Anthropic ``message`` and its event stream, a Responses ``response`` and its event
stream. Answering must cost (almost) nothing, so nothing here runs per request."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

MODEL = "gpt-4o"
REPLY = "I will run the failing test first, then look at the parser and make the smallest fix."


@dataclass
class Payloads:
    """Every chat response as bytes, built once: answering must cost (almost) nothing."""

    completion: bytes
    stream_events: list[bytes] = field(default_factory=list)


def _event(kind: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + _compact({"type": kind, **payload}) + b"\n\n"


def anthropic_payloads(chunks: int) -> Payloads:
    """The reply as an Anthropic ``message`` and as its event stream."""
    usage = {"input_tokens": 2000, "output_tokens": 21}
    message = {"id": "msg_bench0001", "type": "message", "role": "assistant", "model": "claude-sonnet-4-6"}
    final = {**message, "content": [{"type": "text", "text": REPLY}], "stop_reason": "end_turn"}
    final |= {"stop_sequence": None, "usage": usage}
    step = max(1, -(-len(REPLY) // max(1, chunks)))
    events = [_event("message_start", {"message": {**message, "content": [], "usage": usage}})]
    events.append(_event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}))
    for i in range(0, len(REPLY), step):
        delta = {"type": "text_delta", "text": REPLY[i : i + step]}
        events.append(_event("content_block_delta", {"index": 0, "delta": delta}))
    events.append(_event("content_block_stop", {"index": 0}))
    delta = {"delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 21}}
    events += [_event("message_delta", delta), _event("message_stop", {})]
    return Payloads(completion=_compact(final), stream_events=events)


def responses_payloads(chunks: int) -> Payloads:
    """The reply as a Responses ``response`` and as its event stream."""
    item = {"type": "message", "id": "msg_b1", "role": "assistant", "status": "completed"}
    item["content"] = [{"type": "output_text", "text": REPLY, "annotations": []}]
    usage = {"input_tokens": 2000, "output_tokens": 21, "total_tokens": 2021}
    response = {"id": "resp_bench0001", "object": "response", "status": "completed", "model": MODEL}
    final = {**response, "output": [item], "usage": usage}
    step = max(1, -(-len(REPLY) // max(1, chunks)))
    opening = {**response, "status": "in_progress", "output": []}
    events = [
        _event("response.created", {"response": opening}),
        _event("response.in_progress", {"response": opening}),
    ]
    events.append(_event("response.output_item.added", {"output_index": 0, "item": {**item, "content": []}}))
    for i in range(0, len(REPLY), step):
        delta = {"output_index": 0, "item_id": "msg_b1", "content_index": 0, "delta": REPLY[i : i + step]}
        events.append(_event("response.output_text.delta", delta))
    events.append(_event("response.output_item.done", {"output_index": 0, "item": item}))
    events.append(_event("response.completed", {"response": final}))
    return Payloads(
        completion=_compact(final),
        stream_events=[e.replace(b"}\n\n", b',"sequence_number":%d}\n\n' % n) for n, e in enumerate(events)],
    )


def _compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def build_payloads(chunks: int) -> Payloads:
    """A valid ``chat.completion`` and the SSE events of the same reply split in ``chunks``."""
    common = {"id": "chatcmpl-bench0001", "created": 1_700_000_000, "model": MODEL}
    completion = {
        **common,
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": REPLY},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 2000, "completion_tokens": 21, "total_tokens": 2021},
    }
    step = max(1, -(-len(REPLY) // max(1, chunks)))
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    deltas += [{"content": REPLY[i : i + step]} for i in range(0, len(REPLY), step)]
    events = []
    for index, delta in enumerate([*deltas, {}]):
        finish = "stop" if index == len(deltas) else None
        chunk = {
            **common,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        events.append(b"data: " + _compact(chunk) + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return Payloads(completion=_compact(completion), stream_events=events)
