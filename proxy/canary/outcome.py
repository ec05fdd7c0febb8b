"""What one canary request came to, from what the upstream answered and what the agent sent.

- ``AnswerCapture``: what the relay keeps of an answer it passes through (its first and last
  64 KiB: a stream's usage is in its first events, Anthropic's, or its last, OpenAI's; an
  error body is short) and whether a tool call went by (the answer asks the agent to go on).
- ``usage_objects``: every usage object of an answer (a JSON body or a stream); the dialect
  reads them as billed (``Dialect.billed``: Chat Completions ``prompt_tokens`` with
  ``prompt_tokens_details.cached_tokens``, Responses ``input_tokens`` with
  ``input_tokens_details.cached_tokens``, Anthropic ``input_tokens`` plus
  ``cache_read_input_tokens`` and ``cache_creation_input_tokens``).
- ``repeated_calls``: the agent's last step re-ran a tool call it had already made (same tool,
  same arguments): re-acquisition that needs no proxy, so the holdout has it too.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from proxy.dialects.base import Usage
from proxy.telemetry.exchange import KEEP

_USAGE = re.compile(rb'"usage"\s*:\s*\{')
# How providers word an answer to a request over the model's window.
_CONTEXT_MARKERS = (
    b"context_length_exceeded",
    b"maximum context length",
    b"prompt is too long",
    b"context window",
    b"too many tokens",
)


def usage_objects(raw: bytes) -> list[dict[str, Any]]:
    """Every ``"usage": {...}`` object in ``raw`` (a JSON body or an event stream)."""
    found = []
    for match in _USAGE.finditer(raw):
        start = match.end() - 1
        depth = 0
        for at in range(start, min(len(raw), start + 4096)):
            byte = raw[at]
            if byte == 0x7B:
                depth += 1
            elif byte == 0x7D:
                depth -= 1
                if depth == 0:
                    try:
                        value = orjson.loads(raw[start : at + 1])
                    except orjson.JSONDecodeError:
                        break
                    if isinstance(value, dict):
                        found.append(value)
                    break
    return found


def add_usage(a: Usage, b: Usage) -> Usage:
    return Usage(a.prompt + b.prompt, a.cached + b.cached, a.written + b.written, a.output + b.output)


def is_context_error(status: int, body: bytes) -> bool:
    if status not in (400, 413):
        return False
    lowered = body[:KEEP].lower()
    return any(marker in lowered for marker in _CONTEXT_MARKERS)


def repeated_calls(messages: list[Any]) -> int:
    """Tool calls of the last assistant message that repeat an earlier call of the history."""
    last = next(
        (i for i in range(len(messages) - 1, -1, -1) if _role(messages[i]) == "assistant"),
        None,
    )
    if last is None:
        return 0
    earlier = {sig for message in messages[:last] for sig in _calls(message)}
    return sum(1 for sig in _calls(messages[last]) if sig in earlier)


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, dict) else None


def _calls(message: Any) -> list[tuple[str, str]]:
    if _role(message) != "assistant" or not isinstance(message.get("tool_calls"), list):
        return []
    found = []
    for call in message["tool_calls"]:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            found.append((str(function.get("name")), " ".join(str(function.get("arguments")).split())))
    return found
