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
its reads and asks again, and the agent's calls of that answer are never run: the model
re-issues them with the evidence in hand, and the agent never receives a call planned before
the model read what it asked for. (Chat drops those calls from the round it sends back; the
Responses and Messages doors send the answer back whole, each of those calls answered with
``NOT_RUN``, since their reasoning and thinking must return with the items that followed them.)

``ReadLoop`` is the sans-I/O core (next request, feed an answer, get reads or the end), the
same for every wire format: its ``Dialect`` counts, appends rounds and withdraws the tool.
``read_answers.py`` runs an answer's reads against the store; ``loop_driver.py`` moves the
bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from policies.tokens import TokenCounter
from proxy.dialects.base import Answer, Dialect
from proxy.read_tool import (
    BadArguments,
    ReadLimits,
    parse_arguments,
)

# Tokens a tool message costs beyond its content (framing, role, the call id).
_RESULT_OVERHEAD = 16
# The room an answer's reads should have before earlier read results are withdrawn for them.
_USEFUL_ROOM = 1000
# What a read may take from the answer's reserve when no view leaves any read room.
LAST_RESORT_TOKENS = 400
_USEFUL_ROOM_PER_CALL = 250
_WITHDRAWN = "[This read result was withdrawn to make room for later reads"


def withdrawn_note(arguments: Any) -> str:
    """What a withdrawn read result says instead: which handle to read again."""
    try:
        handle = parse_arguments(arguments, 1).handle
    except BadArguments:
        handle = "?"
    return f"{_WITHDRAWN}; read handle={handle} again if you still need it.]"


@dataclass(frozen=True, slots=True)
class LoopLimits:
    max_rounds: int = 4
    max_calls_per_answer: int = 8
    max_total_bytes: int = 262_144
    read: ReadLimits = field(default_factory=ReadLimits)
    timeout_seconds: float = 5.0
    # What an upstream's answer to a read round may be at most: a JSON body, one stream event.
    max_response_bytes: int = 64 << 20
    max_event_bytes: int = 16 << 20


@dataclass
class LoopResult:
    rounds: int = 0
    reads: list[str] = field(default_factory=list)  # outcome of each read: ok, truncated, not_found...
    usage_per_round: list[dict[str, Any]] = field(default_factory=list)
    # Prompt tokens of each request sent upstream, in the proxy's count.
    round_tokens: list[int] = field(default_factory=list)
    bytes_read: int = 0
    status: int = 0
    upstream_seconds: float = 0.0
    error: str | None = None
    # The last round's answer as the model wrote it (its items, in the dialect's shape).
    final_answer: list[Any] | None = None
    # Earlier read results withdrawn (replaced by a note naming their handle) to make room.
    withdrawn: int = 0

    @property
    def largest_request(self) -> int:
        return max(self.round_tokens, default=0)


class ReadLoop:
    """The loop's decisions, without I/O: what to send next, and what an answer asks for."""

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
        self.encoding = counter.encoding_for(body.get("model"))
        self.window = window
        self.reserve = reserve
        self.limits = limits
        self.result = LoopResult()
        self.exhausted = False  # a limit was reached: the next round goes without the read tool
        self._previous: dict[str, Any] | None = None  # the body before the last reads
        self._base = body  # the first round's body, before any read
        self._rounds: list[tuple[Answer, list[tuple[Any, str]]]] = []

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

    def next_request(self) -> dict[str, Any]:
        """The body of the next round. The last allowed one goes without the read tool: the
        model then answers, or calls the agent's own tools (``tool_choice: none`` would forbid
        those, and an agent takes a text answer for the end of its task). A round whose reads
        came out larger than the room they were given (counting is done per piece) is sent
        without them: the model goes on from what it had."""
        if self.dialect.count(self.body, self.counter) > self.hard_budget and self._previous is not None:
            self.body, self._previous = self._previous, None
            self._rounds.pop()
            self.exhausted = True
        body = self.body
        if self.result.rounds >= self.limits.max_rounds or self.exhausted:
            body = self.dialect.without_read_tool(body)
        self.result.round_tokens.append(self.dialect.count(body, self.counter))
        return body

    def wants_reads(self, calls: list[Any]) -> list[Any]:
        """The internal calls of an answer the loop will resolve (none once rounds run out)."""
        internal = [c for c in calls if self.dialect.is_read_call(c)]
        if not internal or self.result.rounds >= self.limits.max_rounds:
            return []
        return internal

    def room_per_read(self, answer: Answer, calls: list[Any], *, hard: bool = False) -> int:
        """Tokens one read result may hold so the next round stays within the window."""
        base = self.dialect.count(
            self.dialect.add_round(self.body, answer, [(c, "") for c in calls]), self.counter
        )
        room = (self.hard_budget if hard else self.budget) - base - len(calls) * _RESULT_OVERHEAD
        return max(0, min(self.limits.read.max_result_tokens, room // max(1, len(calls))))

    def room_total(self, answer: Answer, calls: list[Any], *, hard: bool = False) -> int:
        """Tokens all of one answer's read results may hold together (uncapped per result)."""
        base = self.dialect.count(
            self.dialect.add_round(self.body, answer, [(c, "") for c in calls]), self.counter
        )
        return max(0, (self.hard_budget if hard else self.budget) - base - len(calls) * _RESULT_OVERHEAD)

    def add_round(self, answer: Answer, results: list[tuple[Any, str]]) -> None:
        self.result.rounds += 1
        self._previous = self.body
        self.body = self.dialect.add_round(self.body, answer, results)
        self._rounds.append((answer, list(results)))

    def make_room(self, answer: Answer, calls: list[Any]) -> None:
        """Earlier rounds' read results, the largest first, are withdrawn (each replaced by a
        note naming its handle, so the model can read it again) until this answer's reads have
        a useful room: a read that does not fit makes room instead of being refused. The call
        and result items stay, so every wire format's pairing rules still hold."""
        needed = min(_USEFUL_ROOM, _USEFUL_ROOM_PER_CALL * len(calls))
        if not self._rounds or self.room_total(answer, calls) >= needed:
            return
        sized = sorted(
            (
                (-self.counter.count_text(text, self.encoding), r, i)
                for r, (_, results) in enumerate(self._rounds)
                for i, (_, text) in enumerate(results)
                if not text.startswith(_WITHDRAWN)
            )
        )
        changed = False
        for _, round_index, item in sized:
            results = self._rounds[round_index][1]
            call = results[item][0]
            results[item] = (call, withdrawn_note(self.dialect.call_arguments(call)))
            self.result.withdrawn += 1
            changed = True
            self.body = self._rebuilt()
            if self.room_total(answer, calls) >= needed:
                break
        if changed:
            self._previous = None

    def _rebuilt(self) -> dict[str, Any]:
        body = self._base
        for answer, results in self._rounds:
            body = self.dialect.add_round(body, answer, results)
        return body

    def skip_round(self) -> None:
        """The answer's reads do not fit at all: ask again without them and without the tool."""
        self.result.rounds += 1
        self.exhausted = True
