"""The final token safeguard: the view never exceeds the window.

While the view is over ``max_share`` x window (less the answer's reserve, and the read tool's
schema when the view names saved outputs), the oldest complete step after the protected head is
dropped. Protected: the system prompt (and system messages inside the history), the first user
message (the task), a summary message, the last user message, and the final step (what the
model must answer now). If the protected messages alone exceed the budget, the view is left as
it is and the fact recorded: trimming further would break the request's meaning, and the
upstream's own error is the honest answer then.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import msgspec

from policies.budget import answer_reserve, names_handles, read_room_for
from policies.conversation import Message, after_fixed, message_text, role
from policies.facts import SafeguardFact
from policies.handles import EXCERPT_PREFIX, PLACEHOLDER_PREFIX, excerpt_text, new_handle
from policies.stages.common import SUMMARY_HEADER
from policies.stages.outputs import action_of, calls_by_id, describe
from policies.stages.summary_state import compact_range, summary_index, view_index_of
from policies.view import Context, Offload, View

# A cut message keeps at least this many tokens of its text.
MIN_EXCERPT_TOKENS = 256


def excerpt(text: str, keep_chars: int) -> tuple[str, str, int]:
    """(head, tail, omitted lines): about ``keep_chars`` characters, two thirds from the start,
    cut at line ends where the lines allow it."""
    head_chars, tail_chars = keep_chars * 2 // 3, keep_chars // 3
    head = text[:head_chars]
    if "\n" in head[head_chars // 2 :]:
        head = head[: head.rindex("\n")]
    tail = text[len(text) - tail_chars :] if tail_chars else ""
    if "\n" in tail[: len(tail) // 2]:
        tail = tail[tail.index("\n") + 1 :]
    omitted = text[len(head) : len(text) - len(tail)].count("\n")
    return head, tail, omitted


class TokenSafeguard(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: ClassVar[str] = "token_safeguard"
    max_share: float = 1.0
    # Tokens kept free for the model's answer.
    reserve_tokens: int = 1024
    # Kept free as well whenever the view names saved outputs, so that a read returns content:
    # the larger of the two, at most a quarter of the window (``policies/budget.py``).
    read_room_tokens: int = 1000
    read_room_share: float = 0.1

    def __post_init__(self) -> None:
        if not 0 < self.max_share <= 1:
            raise ValueError("max_share must be in (0, 1]")
        if self.reserve_tokens < 0 or self.read_room_tokens < 0:
            raise ValueError("reserve_tokens and read_room_tokens must be >= 0")
        if not 0 <= self.read_room_share < 1:
            raise ValueError("read_room_share must be in [0, 1)")

    def read_room(self, window: int) -> int:
        return read_room_for(window, self.read_room_tokens, self.read_room_share)

    def budget(self, view: View, ctx: Context) -> int:
        """The largest view: the window share, less the answer's reserve (the request's own
        ``max_tokens`` when larger) and, for a view naming saved outputs, what the proxy adds
        (the read tool's schema) and the read room."""
        plain = int(self.max_share * ctx.window) - answer_reserve(ctx)
        # Trimming may cut an output to an excerpt with a handle: then the schema comes too.
        handles = names_handles(view) or view.tokens(ctx) > plain
        return plain - ((ctx.injected_tokens + ctx.read_room) if handles else 0)

    async def apply(self, view: View, ctx: Context) -> View:
        budget = self.budget(view, ctx)
        total = view.tokens(ctx)
        if total <= budget:
            return view
        messages = view.messages
        conversation = view.conversation()
        counts = ctx.counter.count_messages(messages, ctx.encoding)
        protected = {conversation.first_user, conversation.last_user}
        protected.update(i for i, m in enumerate(messages) if message_text(m).startswith(SUMMARY_HEADER))
        # Pinned steps are never dropped (nor summarized): they may still be cut to an excerpt.
        protected.update(ctx.pins.pinned_steps(messages))
        # Nor are the messages a summary keeps verbatim after it (an earlier last user message):
        # dropped, they would be lost, and the steps after them could not be folded.
        kept = set(view.checkpoint.pinned)
        protected.update(i for i, o in enumerate(view.origin) if o in kept)
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
        folded = False
        if drop:
            folded = ctx.summarizes and await self._fold(view, ctx, drop)
            if not folded:
                view.replace_messages(
                    [m for i, m in enumerate(messages) if i not in drop],
                    self.name,
                    origin=[o for i, o in enumerate(view.origin) if i not in drop],
                )
            # Trimming rewrites the view: reported as a compaction point of its own kind.
            view.trigger = view.trigger or "safeguard"
            total = view.tokens(ctx)
        cut = 0
        if total > budget:
            total, cut = self._cut_largest(view, ctx, total, budget)
        view.facts.token_safeguard = SafeguardFact(
            dropped_messages=0 if folded else len(drop),
            summarized_messages=len(drop) if folded else 0,
            cut_messages=cut,
            over_budget=total > budget,
        )
        return view

    async def _fold(self, view: View, ctx: Context, drop: set[int]) -> bool:
        """In a policy that summarizes, steps the view has no room for are summarized (the
        state ledger, no model call) instead of dropped without a trace: possible when they are
        the oldest after the task and the summary, as the safeguard picks them."""
        original = view.original_conversation()
        if original.first_user < 0:
            return False
        anchor = after_fixed(view.original, original.first_user + 1)  # as ``summarize`` places it
        current = summary_index(view)
        first = current + 1 if current is not None else view_index_of(view, anchor)
        kept_pins = {
            i for i, m in enumerate(view.messages) if i >= first and view.origin[i] in view.checkpoint.pinned
        }
        start = first + len(kept_pins)
        cut = max(drop) + 1
        if min(drop) != start or set(range(start, cut)) != drop or cut > len(view.messages):
            return False
        pinned = ctx.pins.pinned_steps(view.original)
        if original.last_user >= anchor:
            pinned.add(original.last_user)
        await compact_range(
            view,
            replace(ctx, summarizer=None),  # the ledger alone: no model call at the last stage
            anchor=anchor,
            cut=cut,
            family="ledger",
            mechanism=self.name,
            goal=message_text(view.original[original.first_user]),
            pinned=pinned,
            task_kept=True,
        )
        return True

    def _cut_largest(self, view: View, ctx: Context, total: int, budget: int) -> tuple[int, int]:
        """Cut the largest tool results and user messages to excerpts until the view fits."""
        messages = list(view.messages)
        counts = list(ctx.counter.count_messages(messages, ctx.encoding))
        candidates = sorted(
            (
                i
                for i, m in enumerate(messages)
                if role(m) in ("tool", "user")
                and counts[i] > 2 * MIN_EXCERPT_TOKENS
                and not message_text(m).startswith((SUMMARY_HEADER, PLACEHOLDER_PREFIX))
            ),
            key=lambda i: -counts[i],
        )
        calls = calls_by_id(messages)
        placeholders = dict(view.checkpoint.placeholders)
        cut = 0
        for index in candidates:
            if total <= budget:
                break
            message: Message = messages[index]
            source = view.origin[index] if index < len(view.origin) else -1
            text = message_text(message)
            if text.startswith(EXCERPT_PREFIX):
                if source < 0:
                    continue
                # An earlier excerpt, cut again shorter: from the client's full text.
                text = message_text(view.original[source])
            goal = max(MIN_EXCERPT_TOKENS, counts[index] - (total - budget))
            keep_chars = max(200, len(text) * goal // max(1, counts[index]))
            handle = new_handle(text)
            name, target = action_of(messages, index, calls) if role(message) == "tool" else ("user", "")
            description = describe(name or "output", target, text)
            # Tokens per character vary along a text: shrink until the excerpt meets its goal.
            for _ in range(6):
                head, tail, omitted = excerpt(text, keep_chars)
                replacement = {**message, "content": excerpt_text(handle, description, head, tail, omitted)}
                new_count = ctx.counter.count_message(replacement, ctx.encoding)
                if new_count <= goal or keep_chars <= 200:
                    break
                keep_chars = max(200, keep_chars * goal // new_count - 100)
            view.offloads[handle] = Offload(handle=handle, content=text, description=description)
            if source >= 0:
                placeholders[ctx.digests.at(source, view.original[source])] = replacement
            messages[index] = replacement
            total -= counts[index] - new_count
            counts[index] = new_count
            cut += 1
        if cut:
            view.replace_messages(messages, self.name, origin=list(view.origin))
            view.remember_replacements(placeholders)
            # Reported as a safeguard point, but not counted as a compaction cycle: with a tiny
            # window every new large output is cut, and that is not thrash.
            view.trigger = view.trigger or "safeguard"
        return total, cut
