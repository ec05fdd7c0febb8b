"""Step-aware compaction with a retained tail (seed 000, section 3.3).

At a compaction point, if the view is still above the low-water ``target`` after the
cheaper stages, the history between the task and the retained tail is summarized: the
previous summary plus the newly covered steps become one new summary (the state ledger
appended). The tail, the newest steps worth up to ``retained_tail`` x window tokens, stays
verbatim, and the cut falls between whole steps (``step_aware``) or at a message boundary
moved forward to the next protocol-safe point (the ablation's "message cuts"). The task,
the first user message, stays verbatim before the summary (``keep_task``).

With ``save_transcript``, every summary of the policy (this stage's, and the token
safeguard's when it folds steps into the summary) saves the messages it replaces verbatim
under one handle its ledger names (``policies/transcript.py``): what the summary folds away,
a small tool output included, can be read back word for word.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from policies.conversation import message_text, parse
from policies.facts import SummarizeFact
from policies.pipeline import Context, View
from policies.stages.common import first_safe_cut_at_or_after
from policies.stages.summary_state import compact_range, summary_index, view_index_of


class Summarize(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: ClassVar[str] = "summarize"
    target: float = 0.5
    retained_tail: float = 0.2
    step_aware: bool = True
    keep_task: bool = True
    prompt: str = "hybrid_v2"
    save_transcript: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.target <= 1 or not 0 <= self.retained_tail < 1:
            raise ValueError("target must be in (0, 1] and retained_tail in [0, 1)")

    def _cut(self, view: View, ctx: Context, first_new: int) -> int:
        conversation = parse(view.messages)
        counts = ctx.counter.count_messages(view.messages, ctx.encoding)
        budget = self.retained_tail * ctx.window
        final = conversation.steps[-1] if conversation.steps else None
        cut = final.start if final else len(view.messages)
        tail = sum(counts[cut:])
        if self.step_aware:
            for step in reversed(conversation.steps[:-1]):
                size = sum(counts[step.start : step.end])
                if step.start < first_new or tail + size > budget:
                    break
                cut, tail = step.start, tail + size
            return cut
        index = cut
        while index - 1 >= first_new and tail + counts[index - 1] <= budget:
            index -= 1
            tail += counts[index]
        return first_safe_cut_at_or_after(conversation, index)

    async def apply(self, view: View, ctx: Context) -> View:
        if not view.compacting:
            return view
        if view.tokens(ctx) <= self.target * ctx.window:
            view.facts.summarize = SummarizeFact(skipped="target reached without a summary")
            return view
        original = parse(view.original)
        anchor = (
            original.first_user + 1 if self.keep_task and original.first_user >= 0 else original.prefix_end
        )
        current = summary_index(view)
        first_new = current + 1 if current is not None else view_index_of(view, anchor)
        cut = self._cut(view, ctx, first_new)
        if cut <= first_new:
            view.facts.summarize = SummarizeFact(skipped="nothing older than the retained tail")
            return view
        # The ledger's goal is the conversation's task, never the first message of the range.
        goal = message_text(view.original[original.first_user]) if original.first_user >= 0 else None
        pinned = ctx.pins.pinned_steps(view.original)
        if original.last_user >= anchor:
            pinned.add(original.last_user)
        await compact_range(
            view,
            ctx,
            anchor=anchor,
            cut=cut,
            family=self.prompt,
            mechanism=self.name,
            goal=goal,
            pinned=pinned,
            task_kept=self.keep_task and original.first_user >= 0,
        )
        view.facts.summarize = SummarizeFact(retained_tail=self.retained_tail, step_aware=self.step_aware)
        return view
