"""Output offloading with handles (seed 000, section 3.3).

At a compaction point, tool outputs are replaced by a placeholder that names a handle
(``handle=out_...``) and describes the output in one line (tool, its main argument, size,
exit code, first and last line), so the model knows what it can read back with
``read_tool_output``. Two kinds are offloaded:

- large outputs: at least ``min_tokens`` tokens;
- cleared outputs: older than the newest ``keep_recent`` outputs and longer than
  ``clear_min_chars`` (sre-agent's micro_compact, but recoverable).

The newest ``keep_recent_steps`` steps that produced output are never touched: the model is
working on them.
This stage only decides; the proxy stores every offloaded output before it sends a view
that names its handle.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from policies.conversation import message_text, parse
from policies.facts import OffloadFact
from policies.handles import is_placeholder, new_handle, placeholder_text
from policies.pipeline import Context, Offload, View
from policies.stages.outputs import action_of, calls_by_id, describe, output_indices


class OffloadOutputs(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: ClassVar[str] = "offload"
    min_tokens: int = 1000
    keep_recent: int | None = 5
    clear_min_chars: int = 500
    keep_recent_steps: int = 1

    def __post_init__(self) -> None:
        if self.min_tokens < 1 or self.clear_min_chars < 0 or self.keep_recent_steps < 0:
            raise ValueError("min_tokens must be >= 1, clear_min_chars and keep_recent_steps >= 0")
        if self.keep_recent is not None and self.keep_recent < 0:
            raise ValueError("keep_recent must be >= 0 or null")

    async def apply(self, view: View, ctx: Context) -> View:
        if not view.compacting:
            return view
        messages = view.messages
        conversation = parse(messages)
        # The newest steps that produced output are what the model is working on.
        producing = [s for s in conversation.steps if s.kind in ("exchange", "observation")]
        if not self.keep_recent_steps:
            protected_from = len(messages)
        elif self.keep_recent_steps <= len(producing):
            protected_from = producing[-self.keep_recent_steps].start
        else:
            protected_from = 0
        outputs = [i for i in output_indices(conversation) if view.origin[i] >= 0]
        recent = set(outputs[-self.keep_recent :]) if self.keep_recent else set(outputs)
        calls = calls_by_id(messages)
        placeholders = dict(view.checkpoint.placeholders)
        replaced = list(messages)
        offloaded = 0
        pinned = ctx.pins.pinned_steps(messages)
        for index in outputs:
            if index >= protected_from or index in pinned:
                continue
            text = message_text(messages[index])
            if not text or is_placeholder(text):
                continue
            large = ctx.counter.count_text(text, ctx.encoding) >= self.min_tokens
            cleared = (
                self.keep_recent is not None and index not in recent and len(text) > self.clear_min_chars
            )
            if not (large or cleared):
                continue
            handle = new_handle(text)
            name, target = action_of(messages, index, calls)
            description = describe(name, target, text)
            view.offloads[handle] = Offload(handle=handle, content=text, description=description)
            placeholder = {**messages[index], "content": placeholder_text(handle, description)}
            source = view.origin[index]
            placeholders[ctx.digests.at(source, view.original[source])] = placeholder
            replaced[index] = placeholder
            offloaded += 1
        if offloaded:
            view.replace_messages(replaced, self.name, origin=list(view.origin))
            view.remember_replacements(placeholders)
            view.facts.offload = OffloadFact(outputs=offloaded, handles=tuple(view.offloads))
            view.decided = True
        return view
