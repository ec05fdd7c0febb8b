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
``loop_driver.py`` moves the bytes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any

from policies.tokens import TokenCounter
from proxy.dialects.base import Answer, Dialect
from proxy.read_tool import BadArguments, ReadLimits, ReadResult, parse_arguments, render
from proxy.store import Store

# Tokens a tool message costs beyond its content (framing, role, the call id).
_RESULT_OVERHEAD = 16
# Below this many tokens of room, a read returns nothing but the advice to go on without it.
_MIN_READ_TOKENS = 48
# The room a read's "no room" answer needs; with less, the calls are dropped unanswered.
_SHORT_RESULT_TOKENS = 32
_NO_ROOM = "Error: no room is left in the context window for saved output; go on without it."


@dataclass(frozen=True, slots=True)
class LoopLimits:
    max_rounds: int = 4
    max_calls_per_answer: int = 8
    max_total_bytes: int = 262_144
    read: ReadLimits = field(default_factory=ReadLimits)
    timeout_seconds: float = 5.0


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
    ) -> None:
        """``body``: the first round's wire body, read tool included. ``reserve``: tokens kept
        for the answer (at least the request's own ``max_tokens``); ``requested``: the answer
        length the request asks for (0: none)."""
        self.body = body
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

    @property
    def budget(self) -> int:
        """The largest request a round may be: the window less the answer's reserve."""
        return self.window - self.reserve

    @property
    def hard_budget(self) -> int:
        """What a round may never exceed: the window less the answer the client asked for (and
        half the policy's reserve for counting differences). Only the short answers that tell
        the model a read did not fit may use the room between the two budgets."""
        return self.window - max(self.reserve // 2, self.requested)

    def next_request(self) -> dict[str, Any]:
        """The body of the next round. The last allowed one goes without the read tool: the
        model then answers, or calls the agent's own tools (``tool_choice: none`` would forbid
        those, and an agent takes a text answer for the end of its task). A round whose reads
        came out larger than the room they were given (counting is done per piece) is sent
        without them: the model goes on from what it had."""
        if self.dialect.count(self.body, self.counter) > self.hard_budget and self._previous is not None:
            self.body, self._previous = self._previous, None
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

    def room_total(self, answer: Answer, calls: list[Any]) -> int:
        """Tokens all of one answer's read results may hold together (uncapped per result)."""
        base = self.dialect.count(
            self.dialect.add_round(self.body, answer, [(c, "") for c in calls]), self.counter
        )
        return max(0, self.budget - base - len(calls) * _RESULT_OVERHEAD)

    def add_round(self, answer: Answer, results: list[tuple[Any, str]]) -> None:
        self.result.rounds += 1
        self._previous = self.body
        self.body = self.dialect.add_round(self.body, answer, results)

    def skip_round(self) -> None:
        """The answer's reads do not fit at all: ask again without them and without the tool."""
        self.result.rounds += 1
        self.exhausted = True


async def resolve_reads(loop: ReadLoop, store: Store, tenant: str, calls: list[Any], answer: Answer) -> None:
    """Run one answer's reads against the store and append them (with the calls) to the loop."""
    limits = loop.limits
    allowed = calls[: limits.max_calls_per_answer]
    room = loop.room_per_read(answer, calls)
    if room < _MIN_READ_TOKENS:
        # No room for content: every call still gets a short answer when that fits the window,
        # and the next round goes without the read tool.
        if loop.room_per_read(answer, calls, hard=True) < _SHORT_RESULT_TOKENS:
            # Not even that: asked again without the calls (there is no room to say why).
            loop.result.reads.extend("no_room" for _ in calls)
            loop.skip_round()
            return
        loop.result.reads.extend("no_room" for _ in calls)
        loop.exhausted = True
        loop.add_round(answer, [(call, _NO_ROOM) for call in calls])
        return
    outcomes = await _read_shared(loop, store, tenant, allowed, loop.room_total(answer, calls))
    results: list[tuple[Any, str]] = []
    for position, call in enumerate(calls):
        if position >= len(allowed):
            outcome = ReadResult(
                f"Error: at most {limits.max_calls_per_answer} reads per answer; ask for the rest in your "
                "next answer.",
                "limited",
            )
        else:
            outcome = outcomes[position]
        loop.result.reads.append(outcome.outcome)
        loop.result.bytes_read += len(outcome.text.encode("utf-8", "replace"))
        results.append((call, outcome.text))
    if loop.result.bytes_read >= limits.max_total_bytes or room < _MIN_READ_TOKENS:
        loop.exhausted = True
    loop.add_round(answer, results)


async def _read_shared(
    loop: ReadLoop, store: Store, tenant: str, calls: list[Any], room: int
) -> list[ReadResult]:
    """The reads of one answer sharing ``room`` tokens by need, not in equal parts: each is
    first rendered with all of it (at most the per-result cap); when together they do not fit,
    the reads smaller than an equal share keep what they need and the others share the rest
    (a search that found two lines never starves the page read beside it)."""
    cap = min(loop.limits.read.max_result_tokens, room)
    outcomes = [await _read_one(loop, store, tenant, call, cap) for call in calls]
    sizes = [loop.counter.count_text(o.text, loop.encoding) for o in outcomes]
    if sum(sizes) <= room or len(calls) < 2:
        return outcomes
    left, large = room, list(range(len(calls)))
    while large:
        share = left // len(large)
        small = [i for i in large if sizes[i] <= share]
        if not small:
            break
        left -= sum(sizes[i] for i in small)
        large = [i for i in large if i not in small]
    for index in large:
        outcomes[index] = await _read_one(loop, store, tenant, calls[index], left // len(large))
    return outcomes


async def _read_one(loop: ReadLoop, store: Store, tenant: str, call: Any, room: int) -> ReadResult:
    return await read_saved_output(
        store,
        tenant,
        loop.dialect.call_arguments(call),
        limits=loop.limits,
        room=room,
        counter=loop.counter,
        encoding=loop.encoding,
        bytes_read=loop.result.bytes_read,
    )


async def read_saved_output(
    store: Store,
    tenant: str,
    arguments: Any,
    *,
    limits: LoopLimits,
    room: int,
    counter: TokenCounter,
    encoding: str,
    bytes_read: int = 0,
) -> ReadResult:
    """One ``read_tool_output`` call: the result text and its outcome (``ok``, ``truncated``,
    ``not_found``, ``expired``, ``bad_arguments``, ``limited``, ``store_error``, ``timeout``)."""
    try:
        args = parse_arguments(arguments, limits.read.max_lines)
    except BadArguments as exc:
        return ReadResult(str(exc), "bad_arguments")
    if bytes_read >= limits.max_total_bytes:
        return ReadResult(
            f"Error: this answer has read {bytes_read} bytes of saved outputs, the limit per request; "
            "go on with what you have.",
            "limited",
        )
    if room < _MIN_READ_TOKENS:
        return ReadResult(_NO_ROOM, "no_room")
    try:
        stored = await store.get_output(tenant, args.handle)
    except Exception:  # the store is down: the model is told, the request goes on
        return ReadResult(f"Error: the saved output {args.handle!r} cannot be read right now.", "store_error")
    if stored is None:
        return ReadResult(f"Error: no saved output with handle {args.handle!r} was found.", "not_found")
    if stored.content is None:
        return ReadResult(
            f"Error: the saved output {args.handle!r} has expired and can no longer be read.", "expired"
        )
    read_limits = replace(
        limits.read,
        max_result_bytes=max(256, min(limits.read.max_result_bytes, limits.max_total_bytes - bytes_read)),
    )
    try:
        return await asyncio.wait_for(
            asyncio.to_thread(
                render,
                args.handle,
                stored.content,
                args,
                limits=read_limits,
                budget_tokens=room,
                counter=counter,
                encoding=encoding,
            ),
            timeout=limits.timeout_seconds,
        )
    except BadArguments as exc:
        return ReadResult(str(exc), "bad_arguments")
    except TimeoutError:
        return ReadResult(
            "Error: the read took too long; ask for fewer lines or a simpler pattern.", "timeout"
        )
