"""Prompt-caching breakpoints of a Messages request: counted, and the proxy's own placed.

The API's rules: at most 4 blocks with ``cache_control`` (a top-level ``cache_control``,
automatic caching, takes a slot too), read in the order tools, system, messages; and a 1-hour
breakpoint (``ttl: "1h"``) may not come after a 5-minute one. The proxy adds one breakpoint of
its own, at the end of the compacted prefix, only when a slot is free (the client's own are
never removed: its last one caches the growing conversation) and with the TTL the breakpoints
after it require.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

MAX_BREAKPOINTS = 4


def _blocks(body: dict[str, Any]) -> Iterator[Any]:
    """Every block that can carry a breakpoint, in the order the API reads them."""
    for key in ("tools", "system"):
        value = body.get(key)
        if isinstance(value, list):
            yield from value
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        for block in content if isinstance(content, list) else []:
            yield block
            inner = block.get("content") if isinstance(block, dict) else None
            if isinstance(inner, list):
                yield from inner


def _breakpoints(body: dict[str, Any]) -> list[Any]:
    return [b for b in _blocks(body) if isinstance(b, dict) and b.get("cache_control") is not None]


def breakpoints(body: dict[str, Any]) -> int:
    return len(_breakpoints(body)) + (body.get("cache_control") is not None)


def _ttl(block: dict[str, Any]) -> str:
    control = block.get("cache_control")
    return "1h" if isinstance(control, dict) and control.get("ttl") == "1h" else "5m"


def place(body: dict[str, Any], marker: dict[str, Any]) -> str | None:
    """Put the proxy's breakpoint on ``marker`` (a block of ``body`` the proxy wrote): None when
    placed, else why not."""
    if breakpoints(body) >= MAX_BREAKPOINTS:
        return "the client's breakpoints use every slot"
    ordered = list(_blocks(body))
    position = next((i for i, b in enumerate(ordered) if b is marker), None)
    if position is None:
        return "no block to mark"
    after = {_ttl(b) for b in ordered[position + 1 :] if isinstance(b, dict) and b.get("cache_control")}
    before = {_ttl(b) for b in ordered[:position] if isinstance(b, dict) and b.get("cache_control")}
    if "1h" in after and "5m" in before:
        return "the client's breakpoints mix TTLs around it"
    marker["cache_control"] = {"type": "ephemeral", "ttl": "1h"} if "1h" in after else {"type": "ephemeral"}
    return None
