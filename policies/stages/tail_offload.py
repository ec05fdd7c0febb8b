"""Handles at the tail: the steady state of a session whose fixed part leaves little room.

When the fixed part of a request (system prompt, tools, task, summary) takes most of the
window, a compaction point buys room for a step or two, and compacting at every other
request would rewrite the view's conversation each time and the provider's prompt cache would
serve only the fixed prompt. Instead, between points, an output leaves the view for its handle
as soon as it is no longer the newest: the placeholder (tool, argument, size, exit code, first
and last line, the handle) replaces it in place. Only the tail of the previous request changes,
so the provider still serves everything before it from its cache, and a step costs the view
its call and a placeholder instead of its whole output: a point then buys many steps.

The rule, in order:

- only in a *tight* session: at its last point, what stays at every point (system prompt,
  tools, task, summary, the answer's reserve) took the point's target by itself, the final
  step left out (``Checkpoint.tight``); a point that missed its target because of one huge
  newest output does not make a session tight;
- only what follows the summary (what it covers is gone) and precedes the newest
  ``keep_recent_steps`` steps that produced output (what the model is working on now);
- an output longer than ``min_chars`` characters; a large edit body of a call (at least
  ``min_argument_tokens``) the same way;
- the decision is sticky: later requests carry the same placeholder, byte for byte.

It runs before the trigger, so the trigger judges the view the upstream would get. It is not a
compaction point (nothing is summarized, the prefix stays): the request's trigger stays unset.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from policies.conversation import message_text
from policies.facts import OffloadFact
from policies.handles import is_placeholder
from policies.stages.offload import offload_edit_calls, offload_output
from policies.stages.outputs import calls_by_id, output_indices
from policies.stages.summary_state import summary_index
from policies.view import Context, View


class TailOffload(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: ClassVar[str] = "tail_offload"
    # An output this long (in characters) or longer leaves the view once it is not the newest.
    min_chars: int = 500
    keep_recent_steps: int = 1
    # Edit bodies of at least this many tokens are saved too (null: edits stay inline).
    min_argument_tokens: int | None = 250

    def __post_init__(self) -> None:
        if self.min_chars < 0 or self.keep_recent_steps < 1:
            raise ValueError("min_chars must be >= 0 and keep_recent_steps >= 1")
        if self.min_argument_tokens is not None and self.min_argument_tokens < 1:
            raise ValueError("min_argument_tokens must be >= 1 or null")

    async def apply(self, view: View, ctx: Context) -> View:
        if not view.checkpoint.tight:
            return view
        messages = view.messages
        conversation = view.conversation()
        producing = [s for s in conversation.steps if s.kind in ("exchange", "observation")]
        if len(producing) <= self.keep_recent_steps:
            return view
        protected_from = producing[-self.keep_recent_steps].start
        first = summary_index(view) or 0
        pinned = ctx.pins.pinned_steps(messages)
        calls = calls_by_id(messages)
        placeholders = dict(view.checkpoint.placeholders)
        replaced = list(messages)
        offloaded = 0
        for index in output_indices(conversation):
            if not first <= index < protected_from or index in pinned or view.origin[index] < 0:
                continue
            text = message_text(messages[index])
            if len(text) <= self.min_chars or is_placeholder(text):
                continue
            offload_output(view, ctx, index, calls, placeholders, replaced)
            offloaded += 1
        edits = 0
        if self.min_argument_tokens is not None:
            indices = range(first, protected_from)
            edits = offload_edit_calls(
                view, ctx, replaced, placeholders, indices, pinned, self.min_argument_tokens
            )
        if offloaded or edits:
            view.replace_messages(replaced, self.name, origin=list(view.origin))
            view.remember_replacements(placeholders)
            view.facts.tail_offload = OffloadFact(
                outputs=offloaded, handles=tuple(view.offloads), edits=edits
            )
        return view
