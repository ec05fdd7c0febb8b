"""When outputs deep in a warm cached prefix may become notes between compaction points.

Between points ``superseded_reads`` changes only the previous request's tail, which the
provider's cache does not hold yet. An output a later step made obsolete further back stays
until the next point, unless rewriting the prefix from it pays:

- rewriting from a message on turns every cached token after it into a cache write once: the
  tokens from there to the end of the request, at (write price - read price);
- each later request then reads the notes' saved tokens fewer from the cache, at the read
  price, until the next compaction point rewrites the prefix anyway;
- the requests ahead are a guess: as many producing steps as the session has made since its
  summary (a session that has run k steps is likely to run about k more), no more than the
  steps left before the trigger's mark at the session's mean step size.

Of the starting points (each note's message) the one that saves the most net of the rewrite
wins, if the saving covers the rewrite ``payback`` times over. Only when a step of the
previous tail acted again on a file or command of an earlier step (``retargets``, a cheap
look at the calls' text) is the whole history parsed to find such outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.conversation import Message, Step, message_text, role, tool_call_ids
from policies.handles import is_placeholder
from policies.prompt_cache import rewrite_pays
from policies.stages.step_outputs import Output, step_calls
from policies.view import Context, View

# A probe shorter than this would match too much to tell anything.
_MIN_PROBE = 4


@dataclass(frozen=True, slots=True)
class Note:
    """An obsolete output at view ``index`` and the note that would stand for it."""

    index: int
    output: Output
    handle: str
    note: str
    text: str


def retargets(
    messages: Sequence[Message], recent: Sequence[Step], start: int, end: int, text_actions: bool
) -> bool:
    """Whether a step from ``end`` on names a file or command that an assistant message in
    ``[start, end)`` names too (its content or its calls' arguments)."""
    probes = {p for step in recent if step.start >= end for p in _probes(messages, step, text_actions)}
    if not probes:
        return False
    for message in messages[start:end]:
        if role(message) != "assistant":
            continue
        text = _acting_text(message)
        if any(probe in text for probe in probes):
            return True
    return False


def _probes(messages: Sequence[Message], step: Step, text_actions: bool) -> list[str]:
    keys = (o.key for o in step_calls(messages, step, text_actions) if o.key is not None)
    return [p for p in map(_probe, keys) if p is not None]


def _probe(key: tuple[str, str]) -> str | None:
    """The text an assistant message that names this file or command holds: the path, or a
    command's longest plain word (its JSON escapes quotes and backslashes)."""
    kind, target = key
    if kind == "read":
        probe = target
    else:
        words = [w for w in target.split() if '"' not in w and "\\" not in w]
        probe = max(words, key=len) if words else ""
    return probe if len(probe) >= _MIN_PROBE else None


def retargeted_steps(
    messages: Sequence[Message], recent: Sequence[Step], start: int, end: int
) -> tuple[set[tuple[str, str]], list[Step]]:
    """For a tool-calling conversation: the keys (files read, commands run) of the steps from
    ``end`` on, and the exchanges in ``[start, end)`` whose calls' arguments name one of them
    (an assistant message with calls and the results that follow it: no parse needed)."""
    keys = {o.key for s in recent if s.start >= end for o in step_calls(messages, s, False) if o.key}
    probes = tuple({p for p in map(_probe, keys) if p is not None})
    steps: list[Step] = []
    if not probes:
        return keys, steps
    for index in range(start, end):
        calls = messages[index].get("tool_calls") if isinstance(messages[index], dict) else None
        if not isinstance(calls, list) or not calls or not _names_any(calls, probes):
            continue
        stop = index + 1
        while stop < end and role(messages[stop]) == "tool":
            stop += 1
        # An exchange whose every result is behind a handle already has nothing left to note,
        # and no edit (an edit's result is short, never offloaded) to tell a read stale.
        if stop > index + 1 and not all(is_placeholder(message_text(m)) for m in messages[index + 1 : stop]):
            steps.append(Step(index, stop, "exchange"))
    return keys, steps


def _names_any(calls: list[object], probes: tuple[str, ...]) -> bool:
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if isinstance(arguments, str) and any(p in arguments for p in probes):
            return True
    return False


def producing_steps(steps: Sequence[Step], after_summary: int) -> int:
    return sum(1 for s in steps if s.start >= after_summary and s.kind in ("exchange", "observation"))


def exchanges_after(messages: Sequence[Message], start: int) -> int:
    """The steps with output from ``start`` on in a tool-calling conversation: its assistant
    messages with calls (the parse's exchanges, without parsing)."""
    return sum(1 for m in messages[start:] if role(m) == "assistant" and tool_call_ids(m))


def _acting_text(message: Message) -> str:
    parts = [message.get("content") if isinstance(message.get("content"), str) else ""]
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if isinstance(arguments, str):
            parts.append(arguments)
    return "\n".join(p for p in parts if isinstance(p, str))


def paying_notes(
    view: View, ctx: Context, notes: Sequence[Note], producing: int, after_summary: int, payback: float
) -> list[Note]:
    """The notes from the starting point whose rewrite pays the most (``notes`` in view
    order), or none."""
    cache = ctx.cache
    if cache is None or not notes:
        return []
    counts = ctx.counter.count_messages(view.messages, ctx.encoding)
    total = view.tokens(ctx)
    ahead = requests_ahead(view, counts, producing, after_summary)
    saved = [
        counts[n.index]
        - ctx.counter.count_message({**view.messages[n.index], "content": n.note}, ctx.encoding)
        for n in notes
    ]
    best, best_net = -1, 0.0
    for start in range(len(notes)):
        saving = sum(saved[start:])
        rewritten = total - ctx.tools_tokens - sum(counts[: notes[start].index])
        if not rewrite_pays(saving, rewritten, ahead, cache, payback):
            continue
        net = saving * cache.read_price * ahead - rewritten * (cache.write_price - cache.read_price)
        if best < 0 or net > best_net:
            best, best_net = start, net
    return list(notes[best:]) if best >= 0 else []


def requests_ahead(view: View, counts: Sequence[int], producing: int, after_summary: int) -> float:
    """The guess at how many later requests read the prefix before the next compaction point
    rewrites it: the ``producing`` steps since the summary, at most the steps left before the
    trigger's mark."""
    trigger = view.facts.trigger
    if trigger is None or producing == 0:
        return float(producing)
    step_size = max(sum(counts[after_summary:]) / producing, 1.0)
    left = max(trigger.threshold - trigger.request_tokens, 0) / step_size
    return float(min(producing, left))
