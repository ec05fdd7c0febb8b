"""The fake Responses model's answers as OpenAI encodes them: the response object (the
non-streamed answer), or its stream (``event: <type>`` + ``data: {json}``: ``response.created``,
``response.in_progress``, per item ``output_item.added`` ... ``output_item.done`` with
``content_part``/``output_text``, ``function_call_arguments`` and ``reasoning_summary_*`` events,
``response.completed`` with the full response object; every event numbered by
``sequence_number``)."""

from __future__ import annotations

import time
from typing import Any

import orjson

from policies.tokens import TokenCounter
from tests.agent_upstream.wire import pieces
from tests.responses_upstream.protocol import message_text


def usage(counter: TokenCounter, tokens: int, output: list[dict[str, Any]]) -> dict[str, Any]:
    reasoning = sum(64 for i in output if i.get("type") == "reasoning")
    text = "".join(
        message_text(i.get("content")) + str(i.get("name") or "") + str(i.get("arguments") or "")
        for i in output
    )
    produced = counter.count_text(text) + reasoning
    return {
        "input_tokens": tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": produced,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": tokens + produced,
    }


def response(
    model: str,
    response_id: str,
    body: dict[str, Any],
    output: list[dict[str, Any]],
    response_usage: Any,
    status: str,
) -> dict[str, Any]:
    """The response object, as the non-streamed answer and in the stream's events."""
    reasoning: dict[str, Any] = body["reasoning"] if isinstance(body.get("reasoning"), dict) else {}
    text: dict[str, Any] = body["text"] if isinstance(body.get("text"), dict) else {}
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": None,
        "model": model,
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "prompt_cache_key": body.get("prompt_cache_key"),
        "reasoning": {"effort": reasoning.get("effort", "medium"), "summary": reasoning.get("summary")},
        "safety_identifier": None,
        "service_tier": "default",
        "store": body.get("store", True),
        "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": text.get("verbosity", "medium")},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_logprobs": 0,
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": response_usage,
        "user": None,
        "metadata": body.get("metadata") or {},
    }


def events(
    model: str,
    response_id: str,
    body: dict[str, Any],
    output: list[dict[str, Any]],
    completed_usage: dict[str, Any],
) -> list[bytes]:
    """The answer as OpenAI streams it (``completed_usage``: the usage ``response.completed``
    reports)."""
    payloads: list[dict[str, Any]] = []
    in_progress = response(model, response_id, body, [], None, "in_progress")
    payloads.append({"type": "response.created", "response": in_progress})
    payloads.append({"type": "response.in_progress", "response": in_progress})
    for index, item in enumerate(output):
        item_id = item["id"]
        base = {"item_id": item_id, "output_index": index}
        kind = item["type"]
        if kind == "reasoning":
            payloads.append(
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "summary": []},
                }
            )
            for summary_index, part in enumerate(item["summary"]):
                at = {**base, "summary_index": summary_index}
                payloads.append(
                    {
                        "type": "response.reasoning_summary_part.added",
                        **at,
                        "part": {"type": "summary_text", "text": ""},
                    }
                )
                for piece in pieces(part["text"], 3):
                    payloads.append({"type": "response.reasoning_summary_text.delta", **at, "delta": piece})
                payloads.append({"type": "response.reasoning_summary_text.done", **at, "text": part["text"]})
                payloads.append({"type": "response.reasoning_summary_part.done", **at, "part": part})
        elif kind == "message":
            text = message_text(item["content"])
            payloads.append(
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "status": "in_progress", "content": []},
                }
            )
            part = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
            at = {**base, "content_index": 0}
            payloads.append({"type": "response.content_part.added", **at, "part": part})
            for piece in pieces(text, 4):
                payloads.append({"type": "response.output_text.delta", **at, "delta": piece, "logprobs": []})
            payloads.append({"type": "response.output_text.done", **at, "text": text, "logprobs": []})
            payloads.append({"type": "response.content_part.done", **at, "part": {**part, "text": text}})
        else:  # function_call
            payloads.append(
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "status": "in_progress", "arguments": ""},
                }
            )
            for piece in pieces(item["arguments"], 5):
                payloads.append({"type": "response.function_call_arguments.delta", **base, "delta": piece})
            payloads.append(
                {"type": "response.function_call_arguments.done", **base, "arguments": item["arguments"]}
            )
        payloads.append({"type": "response.output_item.done", "output_index": index, "item": item})
    completed = response(model, response_id, body, output, completed_usage, "completed")
    payloads.append({"type": "response.completed", "response": completed})
    return [
        b"event: "
        + str(p["type"]).encode()
        + b"\ndata: "
        + orjson.dumps({**p, "sequence_number": n})
        + b"\n\n"
        for n, p in enumerate(payloads)
    ]
