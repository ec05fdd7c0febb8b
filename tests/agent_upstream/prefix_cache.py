"""OpenAI's automatic prefix caching, as the fake model reports it.

OpenAI caches the prompt's prefix: a request whose first tokens equal those of a recent
request's prompt reads them from the cache and reports how many in
``usage.prompt_tokens_details.cached_tokens``, counted only from 1,024 tokens on and in steps
of 128. This model of it: the prompt's token sequence is a canonical rendering of the request
in order (the tools as JSON, then each message: role, content, tool calls, tool call id), each
part encoded on its own with the request model's encoding (o200k_base, packaged, offline), so a
change in message ``k`` keeps every token before it as the common prefix. The cached tokens are
the longest common prefix with any of the last ``horizon`` prompts received, at least 1,024 and
rounded down to a multiple of 128, told in the prompt's own count (``usage.prompt_tokens``:
the parts wholly in common as the counter counts them, plus the common tokens of the part where
the prompts part ways).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import orjson

from policies.encodings import load_encoding
from policies.tokens import TokenCounter

CACHE_MIN_TOKENS = 1024
CACHE_STEP_TOKENS = 128


def rendered_parts(body: dict[str, Any]) -> list[str]:
    """The request as the cache sees it, in prompt order: the tools, then each message."""
    parts: list[str] = []
    tools = body.get("tools")
    if tools:
        parts.append("tools:" + orjson.dumps(tools, option=orjson.OPT_SORT_KEYS).decode())
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict):
            parts.append(orjson.dumps(message).decode())
            continue
        content = message.get("content")
        text = content if isinstance(content, str) or content is None else orjson.dumps(content).decode()
        part = f"<|{message.get('role')}|>{text or ''}"
        if message.get("tool_calls"):
            part += "<|calls|>" + orjson.dumps(message["tool_calls"], option=orjson.OPT_SORT_KEYS).decode()
        if message.get("tool_call_id"):
            part += f"<|call_id|>{message['tool_call_id']}"
        parts.append(part + "<|end|>")
    return parts


def cacheable(common: int) -> int:
    """The cached tokens OpenAI reports for a common prefix of ``common`` tokens."""
    if common < CACHE_MIN_TOKENS:
        return 0
    return common // CACHE_STEP_TOKENS * CACHE_STEP_TOKENS


def common_prefix(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> int:
    """Length of the longest common prefix of two token arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class PrefixCache:
    """The prompts of the last ``horizon`` requests served, and the cached tokens of a new one.

    The common prefix is found on the canonical token sequences, then told in the prompt's own
    count (``TokenCounter.count_request``, what ``usage.prompt_tokens`` reports): each part
    wholly in common counts as the counter counts it (its schemas, its message), the part
    where the prompts part ways counts its common tokens (at most its own count)."""

    def __init__(self, counter: TokenCounter, horizon: int = 32) -> None:
        self.counter = counter
        self.horizon = horizon
        self._recent: deque[np.ndarray[Any, Any]] = deque(maxlen=max(1, horizon))
        self._parts: dict[tuple[str, str], list[int]] = {}  # encoded parts, by encoding and text

    def _encoded(self, body: dict[str, Any]) -> tuple[np.ndarray[Any, Any], list[int]]:
        """The canonical token sequence, and where each part of it ends."""
        name = self.counter.encoding_for(body.get("model"))
        encoding = load_encoding(name)
        out: list[int] = []
        ends: list[int] = []
        for part in rendered_parts(body):
            encoded = self._parts.get((name, part))
            if encoded is None:
                encoded = encoding.encode_ordinary(part)
                self._parts[(name, part)] = encoded
            out += encoded
            ends.append(len(out))
        return np.asarray(out, dtype=np.int64), ends

    def tokens(self, body: dict[str, Any]) -> np.ndarray[Any, Any]:
        """The prompt's canonical token sequence (each part encoded once, then remembered)."""
        return self._encoded(body)[0]

    def counted(self, body: dict[str, Any]) -> list[int]:
        """Each part's tokens in the prompt's own count: the tools (when any), each message."""
        encoding = self.counter.encoding_for(body.get("model"))
        tools = [self.counter.count_tools(body["tools"], encoding)] if body.get("tools") else []
        messages = body.get("messages")
        counts = self.counter.count_messages(messages, encoding) if isinstance(messages, list) else ()
        return [*tools, *counts]

    def common_counted(self, body: dict[str, Any], common: int) -> int:
        """``common`` canonical tokens of ``body``'s prompt, told in the prompt's own count."""
        _, ends = self._encoded(body)
        total, start = 0, 0
        for end, counted in zip(ends, self.counted(body), strict=True):
            if common >= end:
                total += counted
            else:
                return total + min(max(0, common - start), counted)
            start = end
        return total

    def serve(self, body: dict[str, Any]) -> int:
        """Cached tokens of ``body``'s prompt against the recent prompts; then it is one of them."""
        prompt = self.tokens(body)
        common = max((common_prefix(prompt, earlier) for earlier in self._recent), default=0)
        self._recent.append(prompt)
        return cacheable(self.common_counted(body, common))
