"""Pins: messages no stage may clear, offload, collapse or summarize away (a policy's
``pins``: the results of named tools with their calls, and messages matching a pattern; and
always, items a dialect keeps as sent and instruction messages inside the history)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from policies.conversation import (
    FIXED_ROLES,
    OPAQUE_ROLE,
    Message,
    message_text,
    parse,
    role,
    system_prefix_end,
)


@dataclass(frozen=True, slots=True)
class Pins:
    """Messages no stage may clear, offload, collapse or summarize away: results of the
    named tools (with their calls), and messages whose text matches one of the patterns."""

    tools: frozenset[str] = frozenset()
    # Compiled with RE2 (``build_pins``): matching time is linear in the text, so no pattern
    # a configuration holds can stall the proxy on a hostile message.
    patterns: tuple[Any, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.tools or self.patterns)

    def pinned_steps(self, messages: Sequence[Message]) -> set[int]:
        """Indices of every message in a step that holds a pinned message (items a dialect
        keeps as sent, ``OPAQUE_ROLE``, and system/developer messages after the leading ones,
        the fixed part, are always pinned)."""
        opaque = any(role(m) == OPAQUE_ROLE for m in messages)
        prefix = system_prefix_end(messages)
        # An instruction inside the history is part of the fixed part: it stays verbatim, and a
        # summary over the steps around it keeps it right after the summary.
        fixed = any(role(m) in FIXED_ROLES for m in messages[prefix:])
        if not self and not opaque and not fixed:
            return set()
        conversation = parse(messages)
        pinned: set[int] = set()
        for step in conversation.steps:
            if fixed and step.kind == "system" and step.start >= prefix:
                pinned.update(range(step.start, step.end))
                continue
            for index in range(step.start, step.end):
                message = messages[index]
                if opaque and role(message) == OPAQUE_ROLE:
                    pinned.update(range(step.start, step.end))
                    break
                if not self:
                    continue
                tool = message.get("name") if role(message) == "tool" else None
                names = {
                    c["function"].get("name")
                    for c in message.get("tool_calls") or []
                    if isinstance(c, dict) and isinstance(c.get("function"), dict)
                }
                text = message_text(message)
                if (tool in self.tools) or (names & self.tools) or any(p.search(text) for p in self.patterns):
                    pinned.update(range(step.start, step.end))
                    break
        return pinned
