"""sre-agent's micro_compact, as that agent ships it: old tool results cleared to a placeholder.

Tool results from previous turns longer than ``min_chars`` are replaced by a fixed
placeholder when they fall outside the newest ``max(keep_recent, current-turn results)``
tool results. The cleared content is not recoverable (that is the shipped behaviour; the
`improved` policy offloads instead). Replayed request by request as a checkpointer would
hold them: once cleared, a result stays cleared (the placeholder is in the checkpoint).

Only tool-role results count; in coding-agent traffic a run is usually one user turn, so
this stage rarely fires there, faithfully.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import msgspec

from policies.conversation import message_text, parse, role
from policies.facts import MicroCompactFact
from policies.view import Context, View

PLACEHOLDER = "[Old tool result content cleared]"


class MicroCompact(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: ClassVar[str] = "micro_compact"
    min_chars: int = 500
    keep_recent: int = 5
    placeholder: str = PLACEHOLDER

    async def apply(self, view: View, ctx: Context) -> View:
        original = view.original
        turn_start = parse(original).last_user
        results = [i for i, o in enumerate(view.origin) if o >= 0 and role(view.messages[i]) == "tool"]
        current_turn = sum(1 for i in results if view.origin[i] > turn_start)
        recent = set(results[-max(self.keep_recent, current_turn) :]) if results else set()
        placeholders = dict(view.checkpoint.placeholders)
        messages = list(view.messages)
        cleared = 0
        pinned = ctx.pins.pinned_steps(view.messages)
        for index in results:
            source = original[view.origin[index]]
            if (
                index in pinned
                or index in recent
                or view.origin[index] > turn_start
                or messages[index] is not source
            ):
                continue
            if len(message_text(source)) <= self.min_chars:
                continue
            placeholder = {**source, "content": self.placeholder}
            placeholders[ctx.digests.at(view.origin[index], source)] = placeholder
            messages[index] = placeholder
            cleared += 1
        if cleared:
            view.replace_messages(messages, self.name, origin=list(view.origin))
            view.checkpoint = replace(view.checkpoint, placeholders=placeholders)
            view.facts.micro_compact = MicroCompactFact(cleared=cleared)
        return view
