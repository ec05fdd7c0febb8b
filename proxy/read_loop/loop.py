"""The ``read_tool_output`` loop: answer the model's reads inside the proxy, then ask again.

When the upstream's answer calls ``read_tool_output``, the proxy runs the reads against the
store, appends the call and its results to the messages and asks the upstream again, up to
``max_rounds`` rounds; the last round is sent without the read tool, so it ends in an answer
or in a call of the agent's own tools (the agent's loop goes on as it would without the
proxy). The client receives only the final answer, with usage summed over all rounds.

**Every round fits the window.** A read result gets at most the tokens left under the window
after the round's messages, the tool schemas and the answer's reserve (the request's
``max_tokens`` or ``max_completion_tokens``, at least the policy's reserve), split between the
reads of one answer and capped per result; it says what it left out. Reads per answer and
bytes read per request are limited too; past a limit the model is told so and goes on without.

If one answer mixes ``read_tool_output`` with the agent's own tool calls, the proxy resolves
its reads and asks again; the agent's calls of that answer are never run (the model re-issues
them with the evidence in hand): Chat drops them from the round it sends back, the Responses
and Messages doors answer each with ``NOT_RUN`` (reasoning returns with its items).

``ReadLoop`` is a sans-I/O state machine for every wire format, JSON and streams (its
``Dialect`` counts, appends rounds, withdraws the tool): it decides, never does I/O.
``start()`` gives the first command, ``feed(answer)`` and ``resolved(results)`` the next one:
``Send``, ``Read``, ``Done`` or ``Fail``. ``driver.py`` does each command's I/O;
``answers.py`` shares an answer's room between its reads (pure, driven from here);
``store_reads.py`` runs a ``Read`` against the store (for the driver).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from policies.tokens import TokenCounter
from proxy.dialects.base import Answer, Dialect
from proxy.read_loop.answers import MIN_READ_TOKENS, NO_ROOM, AnswerReads
from proxy.read_loop.commands import (
    Command,
    Done,
    Fail,
    LoopLimits,
    LoopMisuse,
    Read,
    Received,
    Send,
)
from proxy.read_loop.shrink import shrink, water_level
from proxy.read_tool.tool import BadArguments, ReadResult, parse_arguments
from proxy.telemetry.exchange import LoopResult
from proxy.wire.errors import ProxyError

# Tokens a tool message costs beyond its content (framing, role, the call id).
_RESULT_OVERHEAD = 16
# The room an answer's reads should have before earlier read results are withdrawn for them.
_USEFUL_ROOM = 1000
# What a read may take from the answer's reserve when no view leaves any read room.
LAST_RESORT_TOKENS = 400
_USEFUL_ROOM_PER_CALL = 250
# The room a read's "no room" answer needs; with less, the calls are dropped unanswered.
_SHORT_RESULT_TOKENS = 32
_WITHDRAWN = "[This read result was withdrawn to make room for later reads"


def withdrawn_note(arguments: Any) -> str:
    """What a withdrawn read result says instead: which handle to read again."""
    try:
        handle = parse_arguments(arguments, 1).handle
    except BadArguments:
        handle = "?"
    return f"{_WITHDRAWN}; read handle={handle} again if you still need it.]"


@dataclass(frozen=True, slots=True)
class _Pending:
    """An answer whose reads run, and its read calls."""

    answer: Answer
    calls: list[Any]
    last_resort: bool
    reads: AnswerReads


class ReadLoop:
    """The loop's decisions: what to send, what an answer's reads get, which answer is final."""

    def __init__(
        self,
        body: dict[str, Any],
        *,
        dialect: Dialect,
        counter: TokenCounter,
        window: int,
        reserve: int,
        limits: LoopLimits,
        requested: int = 0,
        handles: tuple[str, ...] = (),
    ) -> None:
        """``body``: the first round's wire body, read tool included. ``reserve``: tokens kept
        for the answer (at least the request's own ``max_tokens``); ``requested``: the answer
        length the request asks for (0: none)."""
        self.body = body
        # The session's saved outputs, newest last: what a search of handle "*" covers.
        self.handles = handles
        self.dialect = dialect
        self.requested = requested
        self.counter = counter
        self.encoding = counter.encoding_for(dialect.model_of(body))
        self.window = window
        self.reserve = reserve
        self.limits = limits
        self.result = LoopResult()
        self.exhausted = False  # a limit was reached: the next round goes without the read tool
        self._previous: dict[str, Any] | None = None  # the body before the last reads
        self._base = body  # the first round's body, before any read
        self._rounds: list[tuple[Answer, list[tuple[Any, str]]]] = []
        self._usage: dict[str, int] = {}  # summed over the rounds
        self._pending: _Pending | None = None
        self._state = "new"  # then "sent" (an answer is due), "reading" (results are), "over"

    @property
    def budget(self) -> int:
        """The largest request a round may be: the window less the answer's reserve."""
        return self.window - self.reserve

    @property
    def hard_budget(self) -> int:
        """What a round may never exceed: the window less the answer the client asked for (and
        half the policy's reserve for counting differences). Only short results may use the
        room between the two budgets: a read, up to ``LAST_RESORT_TOKENS``, when no view leaves
        any read room, and the answers that tell the model a read did not fit."""
        return self.window - max(self.reserve // 2, self.requested)

    # --- the commands ---------------------------------------------------------------------

    def start(self) -> Send:
        """The first round."""
        self._expect("new")
        return self._send()

    def feed(self, answer: Answer | Received) -> Command:
        """The upstream's answer to the last ``Send``: its reads, or the end."""
        self._expect("sent")
        received = answer if isinstance(answer, Received) else Received.of(answer)
        self.dialect.add_usage(self._usage, received.usage)
        self.result.usage_per_round.append(received.usage or {})
        reads = self._wanted(received.calls)
        if reads:
            return self._plan(received.whole(), reads)
        self._state = "over"
        if not received.complete:
            # The upstream closed its stream without finishing the answer.
            self.result.error = "upstream_reset"
            return Fail(
                ProxyError(
                    502,
                    "The upstream stream ended before the answer was complete.",
                    type="upstream_error",
                    code="upstream_reset",
                )
            )
        self.result.final_answer = list(received.items)
        return Done(self._usage)

    def resolved(self, results: Sequence[ReadResult]) -> Command:
        """The results of the pending ``Read``, in its order."""
        self._expect("reading")
        assert self._pending is not None
        self._pending.reads.take(results)
        return self._next_read()

    # --- the room of one answer's reads ---------------------------------------------------

    def room_per_read(self, answer: Answer, calls: list[Any], *, hard: bool = False) -> int:
        """Tokens one read result may hold so the next round stays within the window."""
        room = self._room(answer, calls, hard) // max(1, len(calls))
        return max(0, min(self.limits.read.max_result_tokens, room))

    def room_total(self, answer: Answer, calls: list[Any], *, hard: bool = False) -> int:
        """Tokens all of one answer's read results may hold together (uncapped per result)."""
        return max(0, self._room(answer, calls, hard))

    def _room(self, answer: Answer, calls: list[Any], hard: bool) -> int:
        base = self.dialect.count(
            self.dialect.add_round(self.body, answer, [(c, "") for c in calls]), self.counter
        )
        return (self.hard_budget if hard else self.budget) - base - len(calls) * _RESULT_OVERHEAD

    def _plan(self, answer: Answer, calls: list[Any]) -> Command:
        """The room of an answer's reads (earlier results withdrawn for it if need be; a
        last-resort read from the answer's reserve when no view leaves read room), or the
        round without them when there is none."""
        self._make_room(answer, calls)
        # The reads share the room by need: "no room" only when not even one short result fits.
        room = self.room_total(answer, calls)
        last_resort = False
        if room < MIN_READ_TOKENS:
            # The smallest view leaves no read room (a system prompt, tools and task that fill the
            # window): a short read may still use part of the answer's reserve, the answer keeping
            # at least half of it, rather than be refused. The read tool goes after it.
            room = min(LAST_RESORT_TOKENS, self.room_total(answer, calls, hard=True))
            last_resort = room >= MIN_READ_TOKENS
        if room < MIN_READ_TOKENS:
            # No room for content: every call still gets a short answer when that fits the
            # window, and the next round goes without the read tool.
            self.result.reads.extend("no_room" for _ in calls)
            self.exhausted = True
            if self.room_per_read(answer, calls, hard=True) < _SHORT_RESULT_TOKENS:
                # Not even that: asked again without the calls (there is no room to say why).
                self.result.rounds += 1
            else:
                self._add_round(answer, [(call, NO_ROOM) for call in calls])
            return self._send()
        reads = AnswerReads(
            [self.dialect.call_arguments(call) for call in calls],
            limit=self.limits.max_calls_per_answer,
            room=room,
            cap=min(self.limits.read.max_result_tokens, room),
            spent=self.result.bytes_read,
            count=lambda text: self.counter.count_text(text, self.encoding),
        )
        self._pending = _Pending(answer, calls, last_resort, reads)
        return self._next_read()

    def _next_read(self) -> Command:
        assert self._pending is not None
        reads = self._pending.reads.next()
        if reads:
            self._state = "reading"
            return Read(reads)
        return self._end_reads(self._pending)

    def _end_reads(self, pending: _Pending) -> Command:
        """The answer's reads are in: the round with their results, and the next request."""
        self._pending = None
        results: list[tuple[Any, str]] = []
        for call, outcome in zip(pending.calls, pending.reads.results, strict=True):
            self.result.reads.append(outcome.outcome)
            self.result.bytes_read += len(outcome.text.encode("utf-8", "replace"))
            results.append((call, outcome.text))
        if self.result.bytes_read >= self.limits.max_total_bytes or pending.last_resort:
            self.exhausted = True
        self._add_round(pending.answer, results)
        return self._send()

    # --- the rounds -----------------------------------------------------------------------

    def _send(self) -> Send:
        body = self._next_request()
        self._state = "sent"
        return Send(body, self.result.largest_request, self.result.rounds)

    def _expect(self, state: str) -> None:
        if self._state != state:
            raise LoopMisuse(f"the loop is {self._state!r}, not {state!r}")

    def _wanted(self, calls: list[Any]) -> list[Any]:
        """The internal calls of an answer the loop will resolve (none once rounds run out)."""
        internal = [c for c in calls if self.dialect.is_read_call(c)]
        if not internal or self.result.rounds >= self.limits.max_rounds:
            return []
        return internal

    def _next_request(self) -> dict[str, Any]:
        """The body of the next round. The last allowed one goes without the read tool: the
        model answers, or calls the agent's own tools (``tool_choice: none`` would forbid them,
        and an agent takes a text answer for its end). A round whose reads came out larger
        than their room (counted per piece) goes without them: the model goes on from what it had."""
        tokens = self.dialect.count(self.body, self.counter)  # once a round, unless it changes
        if tokens > self.hard_budget and self._previous is not None:
            self.body, self._previous = self._previous, None
            self._rounds.pop()
            self.exhausted = True
            tokens = self.dialect.count(self.body, self.counter)
        body = self.body
        if self.result.rounds >= self.limits.max_rounds or self.exhausted:
            body = self.dialect.without_read_tool(body)
            tokens = self.dialect.count(body, self.counter)
        self.result.round_tokens.append(tokens)
        return body

    def _add_round(self, answer: Answer, results: list[tuple[Any, str]]) -> None:
        self.result.rounds += 1
        self._previous = self.body
        self.body = self.dialect.add_round(self.body, answer, results)
        self._rounds.append((answer, list(results)))

    def _make_room(self, answer: Answer, calls: list[Any]) -> None:
        """When this answer's reads have less than a useful room, earlier rounds' read results
        make it: first they shrink to a common level (``shrink.py``: the largest first, each
        keeping its first lines and giving the exact arguments of the rest); only if that is not
        enough, and a later read round can still read them back (not in the last one), whole
        results are withdrawn, the largest first, each replaced by a note naming its handle. The
        call and result items stay, so every wire format's pairing rules still hold."""
        needed = min(_USEFUL_ROOM, _USEFUL_ROOM_PER_CALL * len(calls))
        room = self.room_total(answer, calls) if self._rounds else needed
        if room >= needed:
            return
        if self._shrink(needed - room):
            self.body, self._previous = self._rebuilt(), None
        if self.result.rounds + 1 >= self.limits.max_rounds or self.room_total(answer, calls) >= needed:
            return
        sized = sorted(
            (
                (-self.counter.count_text(text, self.encoding), r, i)
                for r, (_, results) in enumerate(self._rounds)
                for i, (_, text) in enumerate(results)
                if not text.startswith(_WITHDRAWN)
            )
        )
        for _, round_index, item in sized:
            results = self._rounds[round_index][1]
            call = results[item][0]
            results[item] = (call, withdrawn_note(self.dialect.call_arguments(call)))
            self.result.withdrawn += 1
            self.body, self._previous = self._rebuilt(), None
            if self.room_total(answer, calls) >= needed:
                break

    def _shrink(self, deficit: int) -> bool:
        """Earlier results cut to the level that frees ``deficit`` tokens (and a margin for
        counting by pieces); whether any was."""
        sizes = [
            (self.counter.count_text(text, self.encoding), r, i)
            for r, (_, results) in enumerate(self._rounds)
            for i, (_, text) in enumerate(results)
            if not text.startswith(_WITHDRAWN)
        ]
        level = water_level([size for size, _, _ in sizes], deficit + deficit // 10 + _RESULT_OVERHEAD)
        changed = False
        for size, round_index, item in sizes:
            call, text = self._rounds[round_index][1][item]
            if size <= level:
                continue
            shorter = shrink(
                text,
                self.dialect.call_arguments(call),
                level,
                lambda t: self.counter.count_text(t, self.encoding),
            )
            if shorter is not None and len(shorter) < len(text):
                self._rounds[round_index][1][item] = (call, shorter)
                self.result.shrunk += 1
                changed = True
        return changed

    def _rebuilt(self) -> dict[str, Any]:
        body = self._base
        for answer, results in self._rounds:
            body = self.dialect.add_round(body, answer, results)
        return body
