"""The read loop's interface, in the manner of h11's events: its limits, what it is fed
(``Received``: an upstream answer) and the commands it gives back (``Send`` a round's body,
``Read`` the reads to run, ``Done``, ``Fail``). ``loop.py`` decides; the driver does the I/O."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from proxy.dialects.base import Answer
from proxy.read_loop.answers import ReadCall
from proxy.read_tool.tool import ReadLimits
from proxy.wire.errors import ProxyError


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


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``body`` upstream, feed back its answer; the client's response is to say the
    largest request so far (this one included) and the rounds answered."""

    body: dict[str, Any]
    tokens_after: int
    read_rounds: int


@dataclass(frozen=True, slots=True)
class Read:
    """Reads that do not depend on each other (one whose byte count depends on another's
    result comes in a later ``Read``); ``resolved`` takes one result per read, in order."""

    reads: tuple[ReadCall, ...]


@dataclass(frozen=True, slots=True)
class Done:
    """The answer fed last goes to the client, with ``usage`` summed over the rounds."""

    usage: dict[str, int]


@dataclass(frozen=True, slots=True)
class Fail:
    """The request ends with ``error`` (by the writer's one failure rule)."""

    error: ProxyError


Command = Send | Read | Done | Fail


@dataclass(frozen=True, slots=True)
class Received:
    """An upstream answer as the loop is fed it: its calls decide, and the whole ``Answer`` is
    built only for a read round (a long stream's text costs a parse of every event).
    ``complete``: the answer finished (a stream's last event came)."""

    calls: list[Any]
    usage: dict[str, Any] | None
    items: list[Any]
    whole: Callable[[], Answer]
    complete: bool = True

    @classmethod
    def of(cls, answer: Answer) -> Received:
        return cls(answer.calls, answer.usage, answer.items, lambda: answer)


class LoopMisuse(RuntimeError):
    """A method called out of turn (e.g. ``resolved`` when no ``Read`` is pending)."""
