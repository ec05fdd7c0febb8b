"""sre-agent's auto_compact, as that agent ships it: one summary of everything before the last user message.

When the estimated context exceeds ``trigger`` x the model's window, everything before the
last user message (after the system prompt) is replaced by one summary; the last user
message and what follows it stay verbatim. In coding-agent traffic the last user message is
usually the task itself, so there is nothing before it to summarize: this stage then never
fires, faithfully. ``improved`` cuts between steps instead. ``save_transcript`` (off, as
shipped) saves the messages each summary replaces verbatim under a handle the summary names.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from policies.conversation import parse
from policies.facts import AutoCompactFact
from policies.stages.summary_state import (
    compact_range,
    is_thrashing,
    over_window_at,
    summary_index,
    view_index_of,
)
from policies.view import Context, View


class AutoCompact(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: ClassVar[str] = "auto_compact"
    trigger: float = 0.8
    prompt: str = "sre"
    save_transcript: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.trigger <= 1:
            raise ValueError("trigger must be in (0, 1]")

    async def apply(self, view: View, ctx: Context) -> View:
        if not view.compacting and view.tokens(ctx) <= self.trigger * ctx.window:
            return view
        conversation = parse(view.original)
        if conversation.last_user < 0:
            return view
        cut = view_index_of(view, conversation.last_user)
        current = summary_index(view)
        first_new = current + 1 if current is not None else view_index_of(view, conversation.prefix_end)
        if cut <= first_new:
            view.facts.auto_compact = AutoCompactFact(
                skipped="nothing before the last user message to summarize"
            )
            return view
        if is_thrashing(view.checkpoint) and view.tokens(ctx) <= over_window_at(ctx):
            view.facts.auto_compact = AutoCompactFact(skipped="re-triggering too often; limited")
            return view
        view.trigger = view.trigger or "threshold"
        await compact_range(
            view,
            ctx,
            anchor=conversation.prefix_end,
            cut=cut,
            family=self.prompt,
            mechanism=self.name,
            goal=None,
            pinned=ctx.pins.pinned_steps(view.original),
        )
        view.facts.auto_compact = AutoCompactFact(trigger=self.trigger, window=ctx.window)
        return view
