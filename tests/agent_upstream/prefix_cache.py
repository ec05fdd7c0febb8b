"""OpenAI's automatic prefix caching, as the fake model reports it.

OpenAI caches the prompt's prefix: a request whose first tokens equal those of a recent
request's prompt reads them from the cache and reports how many in
``usage.prompt_tokens_details.cached_tokens``, counted only from 1,024 tokens on and in steps
of 128. This model of it: the prompt's token sequence is a canonical rendering of the request
in order (the tools as JSON, then each message: role, content, tool calls, tool call id), each
part encoded on its own with the request model's encoding (o200k_base, packaged, offline), so a
change in message ``k`` keeps every token before it as the common prefix. The cached tokens are
the longest common prefix with any of the last ``horizon`` prompts received, at least 1,024 and
rounded down to a multiple of 128.
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
    """The prompts of the last ``horizon`` requests served, and the cached tokens of a new one."""

    def __init__(self, counter: TokenCounter, horizon: int = 32) -> None:
        self.counter = counter
        self.horizon = horizon
        self._recent: deque[np.ndarray[Any, Any]] = deque(maxlen=max(1, horizon))
        self._parts: dict[tuple[str, str], list[int]] = {}  # encoded parts, by encoding and text

    def tokens(self, body: dict[str, Any]) -> np.ndarray[Any, Any]:
        """The prompt's canonical token sequence (each part encoded once, then remembered)."""
        name = self.counter.encoding_for(body.get("model"))
        encoding = load_encoding(name)
        out: list[int] = []
        for part in rendered_parts(body):
            encoded = self._parts.get((name, part))
            if encoded is None:
                encoded = encoding.encode_ordinary(part)
                self._parts[(name, part)] = encoded
            out += encoded
        return np.asarray(out, dtype=np.int64)

    def serve(self, body: dict[str, Any]) -> int:
        """Cached tokens of ``body``'s prompt against the recent prompts; then it is one of them."""
        prompt = self.tokens(body)
        common = max((common_prefix(prompt, earlier) for earlier in self._recent), default=0)
        self._recent.append(prompt)
        return cacheable(common)
