"""The high-water trigger: decides whether this request is a compaction point.

Between compaction points the session's sticky decisions are re-applied as they are, so the
prefix only grows; at a compaction point the following stages may decide anew. A session
that keeps re-triggering is limited (and reported) rather than summarized again and again.

With the provider's prompt cache known (``Context.cache``), the mark follows the cache:

- a session back after its cache expired is compacted from ``cold_high`` (lower than
  ``high``): its prefix is a miss whatever is sent, so a point then costs no cache;
- a session whose prefix the provider has just written anew (the previous
  ``write_grace`` requests: a compaction point, a return after expiry, a rewrite that paid)
  is not compacted until the window requires it (the read room or the window itself), so
  the write is read back before it is thrown away.
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
    # The mark for a session back after its prompt cache expired (null: ``high`` always).
    cold_high: float | None = None
    # Requests after the provider wrote the prefix anew during which only the window compacts
    # (0: the cache is not consulted).
    write_grace: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.high <= 1:
            raise ValueError("high must be in (0, 1]")
        if self.cold_high is not None and not 0 < self.cold_high <= self.high:
            raise ValueError("cold_high must be in (0, high]")
        if self.write_grace < 0:
            raise ValueError("write_grace must be >= 0")

    async def apply(self, view: View, ctx: Context) -> View:
        """A compaction point when the whole request passes ``high`` x window, or when it would
        eat into the read room; after a point that ended above its target, only the latter."""
        tokens = view.tokens(ctx)
        request = whole_request(view, ctx)
        hard = read_ceiling(ctx) if names_handles(view) else ctx.window
        high = int(self._mark(view, ctx) * ctx.window)
        waits = view.checkpoint.short_of_target or self._just_written(view, ctx)
        threshold = hard if waits else min(high, hard)
        view.facts.trigger = TriggerFact(
            tokens=tokens,
            threshold=threshold,
            window=ctx.window,
            request_tokens=request,
            read_room=ctx.read_room if names_handles(view) else 0,
            cold=ctx.cache is not None and ctx.cache.cold,
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

    def _mark(self, view: View, ctx: Context) -> float:
        cold = ctx.cache is not None and ctx.cache.cold
        return self.cold_high if cold and self.cold_high is not None else self.high

    def _just_written(self, view: View, ctx: Context) -> bool:
        """The provider wrote this session's prefix anew within the last ``write_grace``
        requests and the cache still holds it."""
        if ctx.cache is None or ctx.cache.cold or not self.write_grace:
            return False
        checkpoint = view.checkpoint
        written = max(checkpoint.prefix_written_at, *checkpoint.recent_compactions[-1:], 0)
        return written > 0 and checkpoint.requests - written <= self.write_grace
