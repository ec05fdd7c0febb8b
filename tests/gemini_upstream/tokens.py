"""The fake's own "Gemini tokenizer".

Google's tokenizer is not published offline; what a test needs is a server that counts the way a
real one does relative to the proxy: differently from the proxy's o200k count, but the same way
every time. The count is tiktoken ``o200k_base`` (offline, through ``TokenCounter``) of each
piece of the prompt, times ``factor`` (default 1.1, rounded up per piece), plus fixed overheads:
``CONTENT_TOKENS`` per content and ``PART_TOKENS`` per part. The pieces: the system
instruction's text, the tool declarations as JSON, each part's text, a call's name and args,
a response's name and response (as JSON), an inline or file part as ``MEDIA_TOKENS``.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from policies.tokens import TokenCounter

DEFAULT_FACTOR = 1.1
CONTENT_TOKENS = 4
PART_TOKENS = 2
MEDIA_TOKENS = 258


class GeminiTokenizer:
    def __init__(self, factor: float = DEFAULT_FACTOR) -> None:
        self.factor = factor
        self.counter = TokenCounter()

    def warm_up(self) -> None:
        self.counter.warm_up(["o200k_base"])

    def _text(self, text: str) -> int:
        return math.ceil(self.counter.count_text(text, "o200k_base") * self.factor)

    def _part(self, part: Any) -> int:
        if not isinstance(part, dict):
            return PART_TOKENS
        if "inlineData" in part or "fileData" in part:
            return PART_TOKENS + MEDIA_TOKENS
        if isinstance(part.get("text"), str):
            return PART_TOKENS + self._text(part["text"])
        data = {k: v for k, v in part.items() if k not in ("thoughtSignature", "thought")}
        return PART_TOKENS + self._text(orjson.dumps(data).decode())

    def count(self, body: dict[str, Any]) -> int:
        """The prompt tokens of a ``generateContent`` request (what ``countTokens`` answers)."""
        total = 0
        system = body.get("systemInstruction")
        if isinstance(system, dict):
            total += sum(self._part(p) for p in system.get("parts") or [])
        tools = body.get("tools")
        if tools:
            total += self._text(orjson.dumps(tools).decode())
        for content in body.get("contents") or []:
            parts = content.get("parts") if isinstance(content, dict) else None
            total += CONTENT_TOKENS + sum(self._part(p) for p in (parts if isinstance(parts, list) else []))
        return total

    def output(self, parts: list[dict[str, Any]]) -> int:
        return sum(self._part(p) for p in parts)
