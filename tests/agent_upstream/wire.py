"""The fake Chat Completions model's answers as OpenAI encodes them: a ``chat.completion``
object, or the ``chat.completion.chunk`` events of a stream (tool calls as deltas, a finishing
chunk, a usage-only chunk when asked for, ``[DONE]``)."""

from __future__ import annotations

import time
from typing import Any

import orjson

from policies.tokens import TokenCounter
from tests.agent_upstream.script import Answer

FINGERPRINT = "fp_agent_upstream"


def usage(counter: TokenCounter, prompt: int, answer: Answer, cached: int = 0) -> dict[str, Any]:
    text = (answer.content or "") + "".join(c.name + c.arguments for c in answer.calls)
    completion = counter.count_text(text) + 3 * len(answer.calls)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def completion(
    model: str, completion_id: str, answer: Answer, answer_usage: dict[str, Any]
) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": answer.content,
        "refusal": None,
        "annotations": [],
    }
    if answer.calls:
        message["tool_calls"] = [c.as_message_part() for c in answer.calls]
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": answer.finish_reason}
        ],
        "usage": answer_usage,
        "service_tier": "default",
        "system_fingerprint": FINGERPRINT,
    }


def chunks(
    model: str, completion_id: str, answer: Answer, answer_usage: dict[str, Any] | None
) -> list[bytes]:
    """The SSE events of ``answer``; ``answer_usage`` None when the client did not ask for usage
    (``stream_options.include_usage``): then no chunk carries a ``usage`` key."""
    created = int(time.time())
    include_usage = answer_usage is not None

    def event(choices: list[Any], chunk_usage: Any = None) -> bytes:
        data: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "service_tier": "default",
            "system_fingerprint": FINGERPRINT,
            "choices": choices,
        }
        if include_usage:
            data["usage"] = chunk_usage
        return b"data: " + orjson.dumps(data) + b"\n\n"

    def delta(part: dict[str, Any], finish: str | None = None) -> bytes:
        return event([{"index": 0, "delta": part, "logprobs": None, "finish_reason": finish}])

    out = [delta({"role": "assistant", "content": "", "refusal": None})]
    for piece in pieces(answer.content or "", 4):
        out.append(delta({"content": piece}))
    for index, call in enumerate(answer.calls):
        out.append(
            delta(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": ""},
                        }
                    ]
                }
            )
        )
        for piece in pieces(call.arguments, 5):
            out.append(delta({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    out.append(delta({}, answer.finish_reason))
    if include_usage:
        out.append(event([], answer_usage))
    out.append(b"data: [DONE]\n\n")
    return out


def pieces(text: str, count: int) -> list[str]:
    """``text`` split into about ``count`` pieces (none when empty)."""
    if not text:
        return []
    size = max(1, -(-len(text) // count))
    return [text[i : i + size] for i in range(0, len(text), size)]
