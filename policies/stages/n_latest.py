"""N latest history messages, cut where no tool exchange is split (no call without its result).

N counts history messages: the system prompt, the tool schemas and the current question
(the last user message; in an agent run that is often the task itself) are outside the
count and always kept, and so is a system/developer message inside the history (the fixed
part: Claude Code's environment block for a model it does not know), at its place. The
boundary moves toward newer messages to exclude an incomplete exchange, so fewer than N
messages may remain; the retained counts are reported in the view's details.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from policies.conversation import FIXED_ROLES, parse, role
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
            if cut != question and role(messages[cut]) not in FIXED_ROLES:
                counted += 1
        cut = first_safe_cut_at_or_after(conversation, cut)

        def kept(cut: int) -> list[int]:
            """What stays of the part cut away, in order: the question and the fixed part."""
            return [i for i in range(start, cut) if i == question or role(messages[i]) in FIXED_ROLES]

        if self.max_share is not None:
            budget = int(self.max_share * ctx.window)
            counts = ctx.counter.count_messages(messages, ctx.encoding)
            # below[c]: the tokens of the head and of what stays of messages[start:c].
            below = [sum(counts[:start]) + ctx.tools_tokens]
            for i in range(start, len(messages)):
                stays = i == question or role(messages[i]) in FIXED_ROLES
                below.append(below[-1] + (counts[i] if stays else 0))
            tail = sum(counts[cut:])
            while cut < len(messages) and below[cut - start] + tail > budget:
                nxt = first_safe_cut_at_or_after(conversation, cut + 1)
                if nxt >= len(messages) or (conversation.steps and nxt > conversation.steps[-1].start):
                    break
                tail -= sum(counts[cut:nxt])
                cut = nxt
        retained = len(messages) - cut
        view.facts.n_latest = NLatestFact(n=self.n, retained_history_messages=retained)
        if cut == start:
            return view
        view.replace_messages(
            [*messages[:start], *(messages[i] for i in kept(cut)), *messages[cut:]], self.name
        )
        return view
