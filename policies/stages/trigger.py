"""The high-water trigger: decides whether this request is a compaction point.

Between compaction points the session's sticky decisions are re-applied as they are, so the
prefix only grows; at a compaction point the following stages may decide anew. A session
that keeps re-triggering is limited (and reported) rather than summarized again and again.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec
from msgspec.structs import replace

from policies.budget import names_handles, read_ceiling, whole_request
from policies.facts import TriggerFact
from policies.stages.summary_state import is_thrashing
from policies.view import Context, View


class Trigger(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: ClassVar[str] = "trigger"
    # Fraction of the model's window above which the view is compacted.
    high: float = 0.8

    def __post_init__(self) -> None:
        if not 0 < self.high <= 1:
            raise ValueError("high must be in (0, 1]")

    async def apply(self, view: View, ctx: Context) -> View:
        """A compaction point when the whole request passes ``high`` x window, or when it would
        eat into the read room; after a point that ended above its target, only the latter."""
        tokens = view.tokens(ctx)
        request = whole_request(view, ctx)
        hard = read_ceiling(ctx) if names_handles(view) else ctx.window
        high = int(self.high * ctx.window)
        threshold = hard if view.checkpoint.short_of_target else min(high, hard)
        view.facts.trigger = TriggerFact(
            tokens=tokens,
            threshold=threshold,
            window=ctx.window,
            request_tokens=request,
            read_room=ctx.read_room if names_handles(view) else 0,
        )
        if view.compacting:
            return view
        if request <= threshold:
            return view
        if is_thrashing(view.checkpoint):
            if request <= hard:
                view.facts.trigger = replace(view.facts.trigger, limited="re-triggering too often")
                return view
            # Limiting now would leave the view over the window, and the token safeguard would
            # drop whole steps without a trace: a compaction (summary + ledger) loses less.
            view.facts.trigger = replace(
                view.facts.trigger, limited="overridden: the view is over the window"
            )
        view.compacting = True
        view.trigger = "repeated" if view.checkpoint.compactions else "threshold"
        return view
