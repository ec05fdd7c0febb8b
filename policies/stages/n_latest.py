"""N latest history messages, cut where no tool exchange is split (no call without its result).

N counts history messages: the system prompt, the tool schemas and the current question
(the last user message; in an agent run that is often the task itself) are outside the
count and always kept. The boundary moves toward newer messages to exclude an incomplete exchange, so fewer
than N messages may remain; the retained counts are reported in the view's details.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from policies.conversation import parse
from policies.facts import NLatestFact
from policies.stages.common import first_safe_cut_at_or_after
from policies.view import Context, View


class NLatest(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: ClassVar[str] = "n_latest"
    n: int = 20
    # Optional token safeguard: also drop the oldest complete steps while the view exceeds
    # this share of the window.
    max_share: float | None = None

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError("n must be >= 1")
        if self.max_share is not None and not 0 < self.max_share <= 1:
            raise ValueError("max_share must be in (0, 1]")

    async def apply(self, view: View, ctx: Context) -> View:
        messages = view.messages
        conversation = parse(messages)
        start = conversation.prefix_end
        # The current question: the last user message (in agent runs, often the task itself).
        question = conversation.last_user if conversation.last_user >= start else -1
        cut = len(messages)
        counted = 0
        while cut > start and counted < self.n:
            cut -= 1
            if cut != question:
                counted += 1
        cut = first_safe_cut_at_or_after(conversation, cut)
        if self.max_share is not None:
            budget = int(self.max_share * ctx.window)
            counts = ctx.counter.count_messages(messages, ctx.encoding)
            fixed = sum(counts[:start]) + ctx.tools_tokens + (counts[question] if 0 <= question < cut else 0)
            while cut < len(messages) and fixed + sum(counts[cut:]) > budget:
                nxt = first_safe_cut_at_or_after(conversation, cut + 1)
                if nxt >= len(messages) or (conversation.steps and nxt > conversation.steps[-1].start):
                    break
                cut = nxt
        keep_question = [messages[question]] if start <= question < cut else []
        retained = len(messages) - cut + len(keep_question)
        view.facts.n_latest = NLatestFact(n=self.n, retained_history_messages=retained - len(keep_question))
        if cut == start:
            return view
        view.replace_messages([*messages[:start], *keep_question, *messages[cut:]], self.name)
        return view
