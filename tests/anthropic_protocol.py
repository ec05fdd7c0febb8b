"""The Messages API's rules for a request history, as its server enforces them: what no view
the proxy sends may break (used by the dialect's tests and the end-to-end fakes)."""

from __future__ import annotations

from typing import Any

MAX_BREAKPOINTS = 4


def _blocks(message: dict[str, Any]) -> list[Any]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content if isinstance(content, list) else []


def breakpoints(body: dict[str, Any]) -> int:
    top = [*(body.get("tools") or []), *(body.get("system") if isinstance(body.get("system"), list) else [])]
    count = sum(1 for b in top if isinstance(b, dict) and b.get("cache_control"))
    for message in body.get("messages") or []:
        for block in _blocks(message):
            count += bool(isinstance(block, dict) and block.get("cache_control"))
            inner = block.get("content") if isinstance(block, dict) else None
            if isinstance(inner, list):
                count += sum(1 for b in inner if isinstance(b, dict) and b.get("cache_control"))
    return count


def problems(body: dict[str, Any]) -> list[str]:
    """Every rule the history breaks: the first message is the user's, roles alternate, every
    ``tool_use`` is answered by a ``tool_result`` at the head of the next user message (the
    last message may be an assistant's prefill), no result without its call, no empty content
    or empty text block, at most four cache breakpoints."""
    found: list[str] = []
    messages = body.get("messages") or []
    if not messages:
        return ["no messages"]
    if messages[0].get("role") != "user":
        found.append("the first message is not the user's")
    for index, message in enumerate(messages):
        blocks = _blocks(message)
        if not blocks:
            found.append(f"messages[{index}] has no content")
        for block in blocks:
            if block.get("type") == "text" and not block.get("text"):
                found.append(f"messages[{index}] has an empty text block")
        if index and messages[index - 1].get("role") == message.get("role"):
            found.append(f"messages[{index}] has the role of the message before it")
        calls = [b.get("id") for b in blocks if b.get("type") == "tool_use"]
        results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
        if message.get("role") == "assistant" and results:
            found.append(f"messages[{index}] (assistant) holds tool results")
        if message.get("role") == "user":
            previous = _blocks(messages[index - 1]) if index else []
            asked = {b.get("id") for b in previous if b.get("type") == "tool_use"}
            stray = [r for r in results if r not in asked]
            if stray:
                found.append(f"messages[{index}] answers calls not made just before it: {stray}")
            kinds = [b.get("type") for b in blocks]
            if results and kinds[: len(results)] != ["tool_result"] * len(results):
                found.append(f"messages[{index}] has blocks before its tool results")
        if calls and index + 1 < len(messages):
            answered = {
                b.get("tool_use_id") for b in _blocks(messages[index + 1]) if b.get("type") == "tool_result"
            }
            missing = [c for c in calls if c not in answered]
            if missing:
                found.append(f"messages[{index}] tool_use ids without tool_result right after: {missing}")
    if breakpoints(body) > MAX_BREAKPOINTS:
        found.append(f"{breakpoints(body)} cache_control breakpoints (at most {MAX_BREAKPOINTS})")
    return found


def signatures(body: dict[str, Any]) -> dict[str, str]:
    """Each thinking block's signature by its thinking text (redacted: its data)."""
    found = {}
    for message in body.get("messages") or []:
        for block in _blocks(message):
            if block.get("type") == "thinking":
                found[str(block.get("thinking"))] = str(block.get("signature"))
            elif block.get("type") == "redacted_thinking":
                found[str(block.get("data"))] = str(block.get("data"))
    return found
