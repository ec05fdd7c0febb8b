"""One answer's ``read_tool_output`` calls: what each read is given, and the reads themselves.

``AnswerReads`` is pure (``ReadLoop`` drives it, after choosing the room): the reads of one
answer share the room by need, and say which reads to run next. ``run_reads`` and
``read_saved_output`` are the I/O, run by the loop driver: each read rendered (or searched,
handle ``*``) against the store in a worker thread within a time limit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from policies.tokens import TokenCounter
from proxy.read_tool.search import search_saved_outputs
from proxy.read_tool.tool import SEARCH_ALL, BadArguments, ReadArguments, ReadResult, parse_arguments, render
from proxy.state.store import Store

if TYPE_CHECKING:  # the loop imports this module; these are its types
    from proxy.read_loop.loop import LoopLimits, ReadLoop

# Below this many tokens of room, a read returns nothing but the advice to go on without it.
MIN_READ_TOKENS = 48
NO_ROOM = "Error: no room is left in the context window for saved output; go on without it."


@dataclass(frozen=True, slots=True)
class ReadCall:
    """One read: the call's arguments, the tokens its result may hold, and the bytes the
    request read before it (the byte limit per request)."""

    arguments: Any
    room: int
    bytes_read: int


class AnswerReads:
    """The reads of one answer while they run, without I/O. Each is first given all of the room
    (at most ``cap``), one at a time: each counts the bytes read before it, so the byte limit
    holds. When together they do not fit, the reads smaller than an equal share keep what they
    need and the others are read again sharing the rest (a search that found two lines never
    starves the page read beside it)."""

    def __init__(
        self,
        arguments: list[Any],
        *,
        limit: int,
        room: int,
        cap: int,
        spent: int,
        count: Callable[[str], int],
    ) -> None:
        """``arguments``: of each read, in order (past ``limit``, they are refused); ``spent``:
        bytes the request read before them; ``count``: tokens of a text."""
        self.arguments = arguments[:limit]
        self.limit = limit
        self.refused = len(arguments) - len(self.arguments)
        self.room = room
        self.cap = cap
        self.spent = spent
        self.count = count
        self.outcomes: list[ReadResult] = []
        self._before: list[int] = []  # the bytes read before each read
        self._again: list[int] | None = None  # the reads run again with a share of the room
        self._asked = 0

    @property
    def results(self) -> list[ReadResult]:
        """Every read's result once all are in, in order (the refused ones told why)."""
        refused = ReadResult(
            f"Error: at most {self.limit} reads per answer; ask for the rest in your next answer.", "limited"
        )
        return [*self.outcomes, *([refused] * self.refused)]

    def next(self) -> tuple[ReadCall, ...]:
        """The reads to run now, which do not depend on each other (none: all are in)."""
        reads: tuple[ReadCall, ...] = ()
        if self._again is None and len(self.outcomes) < len(self.arguments):
            self._before.append(self.spent)
            reads = (ReadCall(self.arguments[len(self.outcomes)], self.cap, self.spent),)
        elif self._again is None:
            self._again, share = self._shares()
            reads = tuple(ReadCall(self.arguments[i], share, self._before[i]) for i in self._again)
        self._asked = len(reads)
        return reads

    def take(self, results: Sequence[ReadResult]) -> None:
        """The results of the reads ``next`` gave, in order."""
        if len(results) != self._asked:
            raise ValueError(f"{len(results)} results for {self._asked} reads")
        self._asked = 0
        if self._again is not None:
            for index, outcome in zip(self._again, results, strict=True):
                self.outcomes[index] = outcome
            return
        for outcome in results:
            self.outcomes.append(outcome)
            self.spent += len(outcome.text.encode("utf-8", "replace"))

    def _shares(self) -> tuple[list[int], int]:
        """The reads to run again, and the room each gets (none when together they fit)."""
        sizes = [self.count(o.text) for o in self.outcomes]
        if sum(sizes) <= self.room or len(sizes) < 2:
            return [], 0
        left, large = self.room, list(range(len(sizes)))
        while large:
            share = left // len(large)
            small = [i for i in large if sizes[i] <= share]
            if not small:
                break
            left -= sum(sizes[i] for i in small)
            large = [i for i in large if i not in small]
        return large, left // len(large) if large else 0


async def run_reads(reads: Sequence[ReadCall], loop: ReadLoop, store: Store, tenant: str) -> list[ReadResult]:
    """A ``Read`` of ``loop`` against the store, in order."""
    return [
        await read_saved_output(
            store,
            tenant,
            read.arguments,
            limits=loop.limits,
            room=read.room,
            counter=loop.counter,
            encoding=loop.encoding,
            bytes_read=read.bytes_read,
            handles=loop.handles,
        )
        for read in reads
    ]


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
    handles: tuple[str, ...] = (),
) -> ReadResult:
    """One ``read_tool_output`` call: the result text and its outcome (``ok``, ``truncated``,
    ``not_found``, ``expired``, ``bad_arguments``, ``limited``, ``store_error``, ``timeout``).
    Handle ``*`` with a pattern searches every saved output of ``handles``."""
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
    if room < MIN_READ_TOKENS:
        return ReadResult(NO_ROOM, "no_room")
    if args.handle == SEARCH_ALL:
        try:
            return await _search(store, tenant, args, limits, room, counter, encoding, bytes_read, handles)
        except BadArguments as exc:
            return ReadResult(str(exc), "bad_arguments")
        except TimeoutError:
            return ReadResult("Error: the search took too long; use a simpler pattern.", "timeout")
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


async def _search(
    store: Store,
    tenant: str,
    args: ReadArguments,
    limits: LoopLimits,
    room: int,
    counter: TokenCounter,
    encoding: str,
    bytes_read: int,
    handles: tuple[str, ...],
) -> ReadResult:
    return await search_saved_outputs(
        store,
        tenant,
        args,
        handles,
        limits=replace(
            limits.read,
            max_result_bytes=max(256, min(limits.read.max_result_bytes, limits.max_total_bytes - bytes_read)),
        ),
        timeout_seconds=limits.timeout_seconds,
        room=room,
        counter=counter,
        encoding=encoding,
    )
