"""The final token safeguard: the view never exceeds the window.

While the view is over ``max_share`` x window, the oldest complete step after the protected
head is dropped. Protected: the system prompt, the first user message (the task), a summary
message, the last user message, and the final step (what the model must answer now). If the
protected messages alone exceed the budget, the view is left as it is and the fact recorded:
trimming further would break the request's meaning, and the upstream's own error is the
honest answer then.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from policies.conversation import message_text, parse
from policies.pipeline import Context, View
from policies.stages.common import SUMMARY_HEADER


class TokenSafeguard(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: ClassVar[str] = "token_safeguard"
    max_share: float = 1.0
    # Tokens kept free for the model's answer.
    reserve_tokens: int = 1024

    def __post_init__(self) -> None:
        if not 0 < self.max_share <= 1:
            raise ValueError("max_share must be in (0, 1]")
        if self.reserve_tokens < 0:
            raise ValueError("reserve_tokens must be >= 0")

    async def apply(self, view: View, ctx: Context) -> View:
        budget = int(self.max_share * ctx.window) - self.reserve_tokens
        total = view.tokens(ctx)
        if total <= budget:
            return view
        messages = view.messages
        conversation = parse(messages)
        counts = ctx.counter.count_messages(messages, ctx.encoding)
        protected = {conversation.first_user, conversation.last_user}
        protected.update(i for i, m in enumerate(messages) if message_text(m).startswith(SUMMARY_HEADER))
        final = conversation.steps[-1] if conversation.steps else None
        drop: set[int] = set()
        for step in conversation.steps:
            if total <= budget:
                break
            if (
                step.kind == "system"
                or step is final
                or any(i in protected for i in range(step.start, step.end))
            ):
                continue
            drop.update(range(step.start, step.end))
            total -= sum(counts[step.start : step.end])
        if drop:
            view.replace_messages([m for i, m in enumerate(messages) if i not in drop], self.name)
            # Trimming rewrites the view: reported as a compaction point of its own kind.
            view.trigger = view.trigger or "safeguard"
        view.details["token_safeguard"] = {"dropped_messages": len(drop), "over_budget": total > budget}
        return view
