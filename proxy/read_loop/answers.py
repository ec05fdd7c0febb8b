"""One answer's ``read_tool_output`` calls: what each read is given and which to run next.

``AnswerReads`` is pure (``ReadLoop`` drives it, after choosing the room): the reads of one
answer share the room by need, and say which reads to run next. The reads themselves, against
the store, are the driver's I/O (``store_reads.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.read_tool.tool import ReadResult

# Below this many tokens of room, a read returns nothing but the advice to go on without it.
MIN_READ_TOKENS = 48
NO_ROOM = "Error: no room is left in the context window for saved output; go on without it."
# A read whose share of the answer's room holds no line: followed by its exact arguments.
NO_ROOM_NOW = (
    "Error: no room is left in the context window for this read in this answer (it is one of "
    "many); read it again in a later answer, alone or with fewer reads:"
)


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
