"""Settled-retry collapse: failed attempts the agent has moved past leave the view.

A chain is two or more consecutive attempts at the same action (same tool and target)
where every attempt but the last failed. Once the agent has moved on to something else the
chain is settled: its failed attempts are dropped and the final result carries a note of
what failed, naming the handles under which the failed outputs are saved (the model can read
them back; nothing is lost). A chain at the end of the history is still active and stays intact.
Decisions are made only at a compaction point and are sticky afterwards.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import msgspec

from policies.conversation import Message, Step, message_text, role
from policies.facts import RetryCollapseFact
from policies.handles import mention, new_handle
from policies.stages.outputs import action_of, calls_by_id, describe, failed, output_indices
from policies.transcript import build_transcript
from policies.view import Context, Offload, View


class RetryCollapse(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: ClassVar[str] = "retry_collapse"
    min_attempts: int = 2

    def __post_init__(self) -> None:
        if self.min_attempts < 2:
            raise ValueError("min_attempts must be >= 2")

    async def apply(self, view: View, ctx: Context) -> View:
        if not view.compacting or not _any_failed(view.messages):
            return view
        messages = view.messages
        conversation = view.conversation()
        calls = calls_by_id(messages)
        outputs = set(output_indices(conversation))
        # One entry per step that produced exactly one output: (step, output index, action, failed).
        attempts: list[tuple[Step, int, tuple[str, str] | None, bool]] = []
        pinned = ctx.pins.pinned_steps(messages)
        for step in conversation.steps:
            produced = [i for i in range(step.start, step.end) if i in outputs and view.origin[i] >= 0]
            if len(produced) == 1 and step.kind in ("exchange", "observation") and step.start not in pinned:
                index = produced[0]
                attempts.append(
                    (step, index, action_of(messages, index, calls), failed(message_text(messages[index])))
                )
            else:
                attempts.append((step, -1, None, False))
        drop: set[int] = set()
        notes: dict[int, str] = {}
        run_start = 0
        for position in range(1, len(attempts) + 1):
            same = (
                position < len(attempts)
                and attempts[position][2] is not None
                and attempts[position][2] == attempts[run_start][2]
                and attempts[position - 1][3]
            )
            if same:
                continue
            chain = attempts[run_start:position]
            settled = position < len(attempts)
            if len(chain) >= self.min_attempts and settled and all(a[3] for a in chain[:-1]) and chain[0][2]:
                saved: list[str] = []
                for step, output, action, _ in chain[:-1]:
                    drop.update(range(step.start, step.end))
                    text = message_text(messages[output])
                    if text and action is not None:
                        handle = new_handle(text)
                        view.offloads[handle] = Offload(handle, text, describe(action[0], action[1], text))
                        saved.append(mention(handle))
                words = _attempts_saved(view, [a[0] for a in chain[:-1]])
                first_error = next(
                    (
                        line.strip()
                        for line in message_text(messages[chain[0][1]]).splitlines()
                        if line.strip()
                    ),
                    "",
                )
                notes[chain[-1][1]] = (
                    f"[Retry note: {len(chain) - 1} earlier attempt(s) of this action failed and were "
                    f"collapsed; first failure: {first_error[:200]}; their outputs are saved "
                    f"({', '.join(saved)}){words}: read them with read_tool_output]\n"
                )
            run_start = position
        if not drop:
            return view
        placeholders = dict(view.checkpoint.placeholders)
        dropped = set(view.checkpoint.dropped)
        kept, origin = [], []
        for index, message in enumerate(messages):
            source = view.original[view.origin[index]] if view.origin[index] >= 0 else None
            if index in drop:
                if source is not None:
                    dropped.add(ctx.digests.at(view.origin[index], source))
                continue
            if index in notes and source is not None:
                message = {**message, "content": notes[index] + message_text(message)}
                placeholders[ctx.digests.at(view.origin[index], source)] = message
            kept.append(message)
            origin.append(view.origin[index])
        view.replace_messages(kept, self.name, origin=origin)
        view.checkpoint = replace(view.checkpoint, dropped=frozenset(dropped))
        view.remember_replacements(placeholders)
        view.facts.retry_collapse = RetryCollapseFact(chains=len(notes), dropped_messages=len(drop))
        view.decided = True
        return view


def _any_failed(messages: list[Message]) -> bool:
    """Whether any message that can be an attempt's output (a tool result, a text agent's
    observation) failed. A settled chain has at least one failed attempt, so without one the
    history's steps are not taken apart at all (each output's verdict is memoized by text)."""
    return any(role(m) in ("tool", "user") and failed(message_text(m)) for m in messages)


def _attempts_saved(view: View, steps: list[Step]) -> str:
    """The collapsed attempts whole (what the agent wrote and called, and what came back), saved
    under one handle: a decision the agent wrote in a failed attempt is never only in a summary.
    Returns the note's words naming it."""
    indices = [i for step in steps for i in range(step.start, step.end)]
    transcript = build_transcript([view.messages[i] for i in indices], [view.origin[i] for i in indices])
    if transcript is None:
        return ""
    handle = transcript.record.handle
    view.offloads[handle] = Offload(handle, transcript.text, "the collapsed attempts, verbatim")
    return f"; the attempts themselves, the agent's words and calls included, under {mention(handle)}"
