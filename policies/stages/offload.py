"""Output offloading with handles: a large output leaves the view but stays readable.

At a compaction point, tool outputs are replaced by a placeholder that names a handle
(``handle=out_...``) and describes the output in one line (tool, its main argument, size,
exit code, first and last line), so the model knows what it can read back with
``read_tool_output``. Two kinds are offloaded:

- large outputs: at least ``min_tokens`` tokens;
- cleared outputs: older than the newest ``keep_recent`` outputs and longer than
  ``clear_min_chars`` (sre-agent's micro_compact, but recoverable).

With ``offload_arguments``, edits are artifacts too: an assistant call (or text action) whose
edit bodies (a created file's text, ``old_str``/``new_str``, an ``apply_patch`` body, a heredoc)
hold at least ``min_argument_tokens`` tokens (default: ``min_tokens``) keeps its id, name and
identifying fields, each body replaced by a placeholder naming the handle of the whole call
(``policies/artifacts.py``); the ledger of a later summary lists every edit by file with the
same handle. Smaller edits stay inline.

The newest ``keep_recent_steps`` steps that produced output are never touched: the model is
working on them.
This stage only decides; the proxy stores every offloaded output before it sends a view
that names its handle.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import msgspec

from policies.artifacts import offload_edits
from policies.conversation import Message, message_text, role
from policies.facts import OffloadFact
from policies.handles import is_placeholder, new_handle, placeholder_text
from policies.stages.outputs import action_of, calls_by_id, describe, output_indices
from policies.view import Context, Offload, View


class OffloadOutputs(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: ClassVar[str] = "offload"
    min_tokens: int = 1000
    keep_recent: int | None = 5
    clear_min_chars: int = 500
    keep_recent_steps: int = 1
    offload_arguments: bool = True
    min_argument_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.min_tokens < 1 or self.clear_min_chars < 0 or self.keep_recent_steps < 0:
            raise ValueError("min_tokens must be >= 1, clear_min_chars and keep_recent_steps >= 0")
        if self.min_argument_tokens is not None and self.min_argument_tokens < 1:
            raise ValueError("min_argument_tokens must be >= 1 or null (then min_tokens)")
        if self.keep_recent is not None and self.keep_recent < 0:
            raise ValueError("keep_recent must be >= 0 or null")

    async def apply(self, view: View, ctx: Context) -> View:
        if not view.compacting:
            return view
        messages = view.messages
        conversation = view.conversation()
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
            offload_output(view, ctx, index, calls, placeholders, replaced)
            offloaded += 1
        # The final step is what the model answers now: its calls stay as they are.
        final = conversation.steps[-1].start if conversation.steps else len(messages)
        edits = 0
        if self.offload_arguments:
            indices = range(min(protected_from, final))
            minimum = self.min_argument_tokens or self.min_tokens
            edits = offload_edit_calls(view, ctx, replaced, placeholders, indices, pinned, minimum)
        if offloaded or edits:
            view.replace_messages(replaced, self.name, origin=list(view.origin))
            view.remember_replacements(placeholders)
            view.facts.offload = OffloadFact(outputs=offloaded, handles=tuple(view.offloads), edits=edits)
            view.decided = True
        return view


def offload_output(
    view: View,
    ctx: Context,
    index: int,
    calls: dict[str, dict[str, Any]],
    placeholders: dict[str, Message],
    replaced: list[Message],
) -> None:
    """The output at view ``index`` saved under its handle and replaced (in ``replaced``) by a
    placeholder that describes it, made sticky through ``placeholders``."""
    messages = view.messages
    text = message_text(messages[index])
    handle = new_handle(text)
    name, target = action_of(messages, index, calls)
    description = describe(name, target, text)
    view.offloads[handle] = Offload(handle=handle, content=text, description=description)
    placeholder = {**messages[index], "content": placeholder_text(handle, description)}
    source = view.origin[index]
    placeholders[ctx.digests.at(source, view.original[source])] = placeholder
    replaced[index] = placeholder


def offload_edit_calls(
    view: View,
    ctx: Context,
    replaced: list[Message],
    placeholders: dict[str, Message],
    indices: Iterable[int],
    pinned: set[int],
    minimum: int,
) -> int:
    """Large edit bodies (at least ``minimum`` tokens) of the assistant messages at view
    ``indices`` -> placeholders (in ``replaced``); the number of edits offloaded."""
    count = 0
    for index in indices:
        message = view.messages[index]
        source = view.origin[index]
        # A message already replaced (by an earlier decision) is never offloaded again.
        if role(message) != "assistant" or source < 0 or index in pinned:
            continue
        if message is not view.original[source]:
            continue
        done = offload_edits(message, minimum, lambda text: ctx.counter.count_text(text, ctx.encoding))
        if done is None:
            continue
        rewritten, artifacts = done
        for art in artifacts:
            view.offloads[art.handle] = Offload(art.handle, art.text, art.description())
        placeholders[ctx.digests.at(source, view.original[source])] = rewritten
        replaced[index] = rewritten
        count += len(artifacts)
    return count
