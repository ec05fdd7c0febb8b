"""The fake's own "Claude tokenizer" and the prompt-caching rule.

Anthropic does not publish its tokenizer; what matters to a test is that the fake counts the
way a real server does relative to the proxy: *differently* from any OpenAI encoding the proxy
may use, but deterministically, so a test can compare the proxy's estimate with it. The count
is tiktoken ``o200k_base`` (loaded offline from ``policies/encodings`` by ``TokenCounter``)
times ``factor`` (default 1.2, rounded up per piece), plus fixed overheads: ``BASE_TOKENS`` per
request, ``MESSAGE_TOKENS`` per message, ``BLOCK_TOKENS`` per tool call or result, and, as the
real API does when ``tools`` is non-empty, a tool-use system prompt (``TOOLS_PROMPT_TOKENS``).

A request is cut into *segments* in the order the model reads them: tools, system, then each
content block of each message. Every segment has a token cost and a canonical key (its JSON
without ``cache_control``), so prefixes can be hashed and priced. That is what the caching rule
needs: a breakpoint (``cache_control`` on a tool, a system block or a content block) caches the
prefix up to and including it; a later request reads the longest prefix cached by an earlier
request, found by looking back from each of its breakpoints at most ``LOOKBACK`` segments (the
documented 20-block lookback); a prefix shorter than the model's minimum is not cached.
``usage.input_tokens`` is what is left after ``cache_read_input_tokens`` and
``cache_creation_input_tokens``, as on the real API (their sum is the prompt).
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from policies.tokens import TokenCounter, json_text

DEFAULT_FACTOR = 1.2
BASE_TOKENS = 4
MESSAGE_TOKENS = 3
BLOCK_TOKENS = 3
TOOL_TOKENS = 5
# The tool-use system prompt the API adds when a request has tools (Claude Sonnet, tool_choice auto).
TOOLS_PROMPT_TOKENS = 346
IMAGE_TOKENS = 1600
LOOKBACK = 20
MAX_BREAKPOINTS = 4


@dataclass(frozen=True, slots=True)
class Segment:
    """One piece of the prompt: a tool, a system block or a message's content block."""

    path: str  # tools[2], system[1], messages[3].content[0]
    tokens: int
    key: bytes  # canonical JSON, without cache_control
    breakpoint: bool  # carries cache_control


@dataclass(frozen=True, slots=True)
class CacheUsage:
    read: int  # cache_read_input_tokens
    creation: int  # cache_creation_input_tokens
    entries: frozenset[bytes]  # prefix hashes this request writes


def _canonical(block: Any, role: Any = None) -> bytes:
    if isinstance(block, dict):
        block = {k: v for k, v in block.items() if k != "cache_control"}
    return orjson.dumps([role, block] if role else block, option=orjson.OPT_SORT_KEYS, default=str)


def _has_breakpoint(block: Any) -> bool:
    return isinstance(block, dict) and isinstance(block.get("cache_control"), dict)


class ClaudeTokenizer:
    """Counts Anthropic Messages requests (see the module docstring). Thread-safe."""

    def __init__(self, factor: float = DEFAULT_FACTOR, counter: TokenCounter | None = None) -> None:
        self.factor = factor
        self.counter = counter or TokenCounter()
        self._lock = threading.Lock()

    def warm_up(self) -> None:
        self.counter.warm_up()

    def text(self, text: str) -> int:
        if not text:
            return 0
        with self._lock:  # the counter's text cache is not thread-safe
            raw = self.counter.count_text(text)
        return math.ceil(raw * self.factor)

    def block(self, block: Any) -> int:
        """Tokens of one content block."""
        if isinstance(block, str):
            return self.text(block)
        if not isinstance(block, dict):
            return self.text(json_text(block))
        kind = block.get("type")
        if kind == "text":
            return self.text(str(block.get("text", "")))
        if kind == "thinking":
            return self.text(str(block.get("thinking", "")))
        if kind == "redacted_thinking":
            return self.text(str(block.get("data", "")))
        if kind in ("tool_use", "server_tool_use"):
            return (
                BLOCK_TOKENS
                + self.text(str(block.get("name", "")))
                + self.text(json_text(block.get("input")))
            )
        if kind == "tool_result":
            content = block.get("content")
            if isinstance(content, list):
                return BLOCK_TOKENS + sum(self.block(part) for part in content)
            return BLOCK_TOKENS + self.text(content if isinstance(content, str) else json_text(content))
        if kind in ("image", "document"):
            return IMAGE_TOKENS
        return self.text(json_text({k: v for k, v in block.items() if k != "cache_control"}))

    def segments(self, body: dict[str, Any]) -> list[Segment]:
        """The prompt of ``body`` as segments, in reading order (tools, system, messages)."""
        segments: list[Segment] = []
        tools = body.get("tools")
        if isinstance(tools, list):
            for n, tool in enumerate(tools):
                schema = (
                    {k: v for k, v in tool.items() if k != "cache_control"}
                    if isinstance(tool, dict)
                    else tool
                )
                cost = TOOL_TOKENS + self.text(json_text(schema)) + (TOOLS_PROMPT_TOKENS if n == 0 else 0)
                segments.append(Segment(f"tools[{n}]", cost, _canonical(tool), _has_breakpoint(tool)))
        system = body.get("system")
        if isinstance(system, str) and system:
            segments.append(Segment("system", self.text(system), _canonical(system), False))
        elif isinstance(system, list):
            for n, block in enumerate(system):
                segments.append(
                    Segment(f"system[{n}]", self.block(block), _canonical(block), _has_breakpoint(block))
                )
        messages = body.get("messages")
        for m, message in enumerate(messages if isinstance(messages, list) else []):
            role = message.get("role") if isinstance(message, dict) else None
            content = message.get("content") if isinstance(message, dict) else None
            blocks = [content] if isinstance(content, str) else content if isinstance(content, list) else []
            if not blocks:
                segments.append(Segment(f"messages[{m}]", MESSAGE_TOKENS, _canonical(None, role), False))
            for n, block in enumerate(blocks):
                cost = self.block(block) + (MESSAGE_TOKENS if n == 0 else 0)
                key = _canonical(block, role if n == 0 else None)
                segments.append(Segment(f"messages[{m}].content[{n}]", cost, key, _has_breakpoint(block)))
        return segments

    def count(self, body: dict[str, Any]) -> int:
        """Input tokens of a Messages request (what ``count_tokens`` answers)."""
        return BASE_TOKENS + sum(s.tokens for s in self.segments(body))

    def output(self, content: Iterable[dict[str, Any]]) -> int:
        """Output tokens of an answer's content blocks."""
        return sum(self.block(b) for b in content)


def breakpoints(segments: list[Segment]) -> list[str]:
    return [s.path for s in segments if s.breakpoint]


def cache_usage(
    segments: list[Segment], written: set[bytes] | frozenset[bytes], min_tokens: int
) -> CacheUsage:
    """The real caching rule (module docstring) for a request of ``segments``, given the prefix
    hashes ``written`` by earlier requests of the same run."""
    hashes: list[bytes] = []
    totals: list[int] = []
    digest = hashlib.sha256()
    total = 0
    for segment in segments:
        digest.update(hashlib.sha256(segment.key).digest())
        hashes.append(digest.copy().digest())
        total += segment.tokens
        totals.append(total)
    marks = [n for n, s in enumerate(segments) if s.breakpoint]
    read_at = -1
    for mark in marks:
        for n in range(mark, max(-1, mark - LOOKBACK - 1), -1):
            if hashes[n] in written:
                read_at = max(read_at, n)
                break
    read = totals[read_at] if read_at >= 0 else 0
    cached = [n for n in marks if totals[n] >= min_tokens]
    creation = 0
    if cached and cached[-1] > read_at:
        creation = totals[cached[-1]] - read
    return CacheUsage(read=read, creation=creation, entries=frozenset(hashes[n] for n in cached))


_shared: ClaudeTokenizer | None = None
_shared_lock = threading.Lock()


def count_tokens(body: dict[str, Any], factor: float = DEFAULT_FACTOR) -> int:
    """The fake's input-token count of a Messages request body (``AnthropicUpstream.count``
    with the default factor), for tests that compare the proxy's estimate with it."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = ClaudeTokenizer()
        shared = _shared
    return (shared if factor == shared.factor else ClaudeTokenizer(factor)).count(body)
