"""Step-aware compaction with a retained tail: a summary of old steps, never of a split step.

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

from dataclasses import replace
from typing import ClassVar

import msgspec

from policies.budget import answer_reserve, read_ceiling, whole_request
from policies.conversation import FIXED_ROLES, after_fixed, message_text, role
from policies.facts import SummarizeFact
from policies.stages.common import first_safe_cut_at_or_after
from policies.stages.summary_state import compact_range, summary_index, view_index_of
from policies.summarizer import LedgerSummarizer
from policies.view import Context, View


class Summarize(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: ClassVar[str] = "summarize"
    target: float = 0.5
    retained_tail: float = 0.2
    step_aware: bool = True
    keep_task: bool = True
    prompt: str = "hybrid_v2"
    save_transcript: bool = True
    # The rendered state ledger's largest size, as a share of the window.
    ledger_share: float = 0.1

    def __post_init__(self) -> None:
        if not 0 < self.target <= 1 or not 0 <= self.retained_tail < 1:
            raise ValueError("target must be in (0, 1] and retained_tail in [0, 1)")
        if not 0 < self.ledger_share <= 0.5:
            raise ValueError("ledger_share must be in (0, 0.5]")

    def _cut(self, view: View, ctx: Context, first_new: int, budget: float) -> int:
        conversation = view.conversation()
        counts = ctx.counter.count_messages(view.messages, ctx.encoding)
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

    def _tail_budget(self, view: View, ctx: Context, first_new: int, last_user: int) -> float:
        """The retained tail's size: ``retained_tail`` x window, less whatever the whole request
        would have above the target with it (what stays anyway: the head before the range, the
        kept last user message and instructions inside the history, the new summary at its
        budget, the answer's reserve and the read tool), so that the compaction point lands at
        its target."""
        counts = ctx.counter.count_messages(view.messages, ctx.encoding)
        current = summary_index(view)
        at = current if current is not None else first_new
        kept = sum(
            counts[i]
            for i in range(at, len(view.messages))
            if view.origin[i] == last_user >= 0 or role(view.messages[i]) in FIXED_ROLES
        )
        narrative = 0 if ctx.summarizer is None or isinstance(ctx.summarizer, LedgerSummarizer) else 0.05
        summary = (ctx.ledger_share + narrative) * ctx.window
        fixed = view.tokens(ctx) - sum(counts[at:]) + kept + summary
        fixed += answer_reserve(ctx) + ctx.injected_tokens
        return min(self.retained_tail * ctx.window, max(0.0, self.target * ctx.window - fixed))

    async def apply(self, view: View, ctx: Context) -> View:
        if not view.compacting:
            return view
        target = int(self.target * ctx.window)
        if whole_request(view, ctx) <= target and not ctx.preparing:
            view.facts.summarize = SummarizeFact(skipped="target reached without a summary")
            view.checkpoint = replace(view.checkpoint, short_of_target=False, tight=False)
            return view
        original = view.original_conversation()
        # The summary starts after the task and the instructions that follow it (Claude Code's
        # environment block for a model it does not know): they stay where they are.
        anchor = (
            after_fixed(view.original, original.first_user + 1)
            if self.keep_task and original.first_user >= 0
            else original.prefix_end
        )
        current = summary_index(view)
        first_new = current + 1 if current is not None else view_index_of(view, anchor)
        cut = self._cut(view, ctx, first_new, self._tail_budget(view, ctx, first_new, original.last_user))
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
        view.facts.summarize = landing_fact(
            view, ctx, target, SummarizeFact(retained_tail=self.retained_tail, step_aware=self.step_aware)
        )
        return view


def landing_fact(view: View, ctx: Context, target: int, fact: SummarizeFact) -> SummarizeFact:
    """Where the compaction point landed against its target and the read room, and why when it
    missed (recorded in the checkpoint, so the next request does not compact again at once)."""
    request = whole_request(view, ctx)
    missed = request > target
    counts = ctx.counter.count_messages(view.messages, ctx.encoding)
    final = view.conversation().steps[-1].start if view.messages else 0
    # Tight: what stays at every point (system prompt, tools, task, summary, the reserves)
    # takes the target by itself, the final step left out: a point buys room for only a step
    # or two, so between points outputs go behind their handles (``tail_offload``).
    tight = request - sum(counts[final:]) > target
    view.checkpoint = replace(view.checkpoint, short_of_target=missed, tight=tight)
    fact = msgspec.structs.replace(fact, request_tokens=request, target_tokens=target)
    if not missed:
        return fact
    kept = sum(counts[:final]) + ctx.tools_tokens
    why = (
        f"the request keeps {request} tokens (system prompt, tools, task, summary and kept user "
        f"messages {kept}; the final step {sum(counts[final:])}; the answer's reserve "
        f"{answer_reserve(ctx)}), over the target {target}"
    )
    fact = msgspec.structs.replace(fact, target_missed=why)
    if request > read_ceiling(ctx):
        first = not view.checkpoint.no_read_room_reported
        view.checkpoint = replace(view.checkpoint, no_read_room_reported=True)
        fact = msgspec.structs.replace(
            fact,
            no_read_room=f"{ctx.window - request} tokens free, less than the read room {ctx.read_room}",
            no_read_room_first=first,
        )
    return fact
