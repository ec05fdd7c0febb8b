"""What one canary request came to, from what the upstream answered and what the agent sent.

- ``AnswerCapture``: what the relay keeps of an answer it passes through (its first and last
  64 KiB: a stream's usage is in its first events, Anthropic's, or its last, OpenAI's; an
  error body is short) and whether a tool call went by (the answer asks the agent to go on).
- ``usage_objects``: every usage object of an answer (a JSON body or a stream); the dialect
  reads them as billed (``Dialect.billed``: Chat Completions ``prompt_tokens`` with
  ``prompt_tokens_details.cached_tokens``, Responses ``input_tokens`` with
  ``input_tokens_details.cached_tokens``, Anthropic ``input_tokens`` plus
  ``cache_read_input_tokens`` and ``cache_creation_input_tokens``, Gemini ``usageMetadata``'s
  ``promptTokenCount`` with ``cachedContentTokenCount``, a stream's repeated objects merged).
- ``outcome_kind``: whose doing a failed answer is (below); only the policy's count against it.
- ``repeated_calls``: the agent's last step re-ran a tool call it had already made (same tool,
  same arguments): re-acquisition that needs no proxy, so the holdout has it too.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from proxy.dialects.base import Usage
from proxy.telemetry.exchange import KEEP

# Chat Completions, Responses and Anthropic say "usage"; Gemini "usageMetadata" (its REST
# JSON) or "usage_metadata" (the same field in proto names).
_USAGE = re.compile(rb'"(?:usage|usageMetadata|usage_metadata)"\s*:\s*\{')
# How providers word an answer to a request over the model's window.
_CONTEXT_MARKERS = (
    b"context_length_exceeded",
    b"maximum context length",
    b"prompt is too long",
    b"context window",
    b"too many tokens",
    b"exceeds the maximum number of tokens",  # Gemini: "The input token count (N) exceeds ..."
)


def usage_objects(raw: bytes) -> list[dict[str, Any]]:
    """Every ``"usage": {...}`` object (Gemini's ``"usageMetadata"``) in ``raw`` (a JSON body or
    an event stream)."""
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


# How providers word a refusal of the conversation's structure (what a view can get wrong: a
# tool result without its call, roles out of order, an item the input no longer holds).
_VIEW = re.compile(
    rb'"param"\s*:\s*"(?:messages|input)|tool_call|tool_use|tool_result|tool output|function call'
    rb"|roles must alternate|messages\.\d|messages\.\[\d|input\[\d"
)


def outcome_kind(status: int, error: str | None, body: bytes) -> str:
    """Whose doing an answer is, so that only the policy's count against the treated arm.

    - ``ok``: a 200 with no error.
    - ``context``: a refusal as over the model's window (the policy's to prevent).
    - ``view``: a 4xx refusing the conversation's structure (what a compacted view can break),
      or a failure of the proxy's own (a 5xx it did not relay): the policy's, as far as the
      answer can tell (the client's own malformed history looks alike in both arms).
    - ``client``: any other 4xx (a bad parameter, auth, a rate limit, a body too large) and a
      client that went away: the client's doing, in either arm; never counted against one.
    - ``upstream``: an upstream 5xx, a timeout, a reset: the upstream's state, which both arms
      see alike; compared in the report, never judged as a treated-only error.
    """
    if status == 200 and error is None:
        return "ok"
    if is_context_error(status, body):
        return "context"
    if error == "client_disconnected":
        return "client"
    # The proxy's codes for the upstream's failures (timeout, reset, unreachable, too large).
    upstream_failure = error is not None and error.startswith("upstream_")
    if upstream_failure or (status >= 500 and error is None):
        return "upstream"  # relayed from the upstream, or the upstream failed to answer
    if status >= 500:
        return "view"  # the proxy's own failure (while compacting, for one): the treated arm's
    if status in (400, 422) and _VIEW.search(body[:KEEP].lower()):
        return "view"
    return "client"


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
