"""Prompt caching and the effective cost of an arm's requests, as a provider would bill them.

Token reduction measures pressure; what a deployment pays is the prompt tokens its provider
does not serve from its prompt cache, the cache reads at their discount, and the summarizer's
calls and read rounds on top. A policy that rewrites its view on every request (a sliding
window) pays full price for nearly all of it; one whose view stays append-only between
compaction points is read back from the cache. So each (arm, case) session's requests, as the
recorded upstream received them, go through a provider's caching rule here.

A request is a sequence of blocks: the tool schemas (with the model name) first, then each
message in order, the system message first. A block is known by a digest of its content and
carries its tokens (the project's offline counter, ``policies.tokens``, for the run's model).
Common prefixes are counted in whole blocks: a changed message misses from its first token,
where a provider would still hit the tokens it shares with the old one up to the change (on
the request right after a compaction point: a small underestimate of hits, never an
overestimate, the same way for every arm).

Rules:

- ``openai`` (automatic prefix caching; Chat Completions and Responses): a request's cached
  tokens are its longest common prefix with any earlier request of its session within the
  horizon, counted from 1,024 tokens on and in 128-token increments (rounded down).
- ``anthropic`` (Messages, explicit ``cache_control`` breakpoints): an entry is written at each
  breakpoint whose prefix reaches 1,024 tokens; a request reads the longest entry it shares,
  found at one of its breakpoints or up to 20 blocks before one (the API's lookback, counted
  in messages here); the tokens from there to its last breakpoint are written (billed at the
  cache-write price) and what follows its last breakpoint is uncached. An entry lives while
  it is written or read within the horizon (the TTL is refreshed on each read).
- ``none``: nothing is cached.

The horizon stands in for the providers' lifetimes (OpenAI: 5 to 10 minutes of inactivity;
Anthropic: 5 minutes, refreshed on use). A replay has no real clock, so an entry lives for
the next ``horizon`` requests of its session (default 16: an agent's requests come seconds
apart, so minutes cover many steps; the horizon decides only whether a view that returns to
an older prefix still finds it). Real caches are best-effort (OpenAI routes by the first few
hundred tokens and can miss under load): these are the savings a cache allows, not a promise.

Request kinds: ``step`` (a recorded step), ``step_read`` (a ``read_tool_output`` round the
proxy made during a step), ``answer`` and ``answer_read`` (a model arm answering a question,
and its read rounds), and ``question`` (the harness's look at the view at a question point:
not a request the agent makes, so neither billed nor cached).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

KINDS = ("step", "step_read", "answer", "answer_read", "question")
RULES = ("openai", "anthropic", "none")
MIN_CACHED_TOKENS = 1024
OPENAI_INCREMENT = 128
ANTHROPIC_LOOKBACK = 20
DEFAULT_HORIZON = 16
DEFAULT_TTL = 300.0


@dataclass(frozen=True, slots=True)
class RequestShape:
    """One request as the cache sees it: its blocks' identities and tokens, its breakpoints."""

    kind: str
    ids: tuple[int, ...]  # per block; equal ids are equal blocks within one session
    tokens: tuple[int, ...]
    breakpoints: tuple[int, ...] = ()  # indices of blocks carrying ``cache_control``
    extra: int = 0  # prompt tokens in no block (the reply priming)
    output: int = 0  # output tokens (of an answering model; recorded steps: 0)
    at: float = 0.0  # simulated seconds from the session's start (``replay.session.clock``)

    @property
    def prompt(self) -> int:
        return sum(self.tokens) + self.extra

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind, "ids": list(self.ids), "tokens": list(self.tokens)}
        for name in ("breakpoints", "extra", "output", "at"):
            value = getattr(self, name)
            if value:
                data[name] = list(value) if isinstance(value, tuple) else value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestShape:
        return cls(
            kind=str(data["kind"]),
            ids=tuple(int(i) for i in data["ids"]),
            tokens=tuple(int(t) for t in data["tokens"]),
            breakpoints=tuple(int(b) for b in data.get("breakpoints") or ()),
            extra=int(data.get("extra") or 0),
            output=int(data.get("output") or 0),
            at=float(data.get("at") or 0.0),
        )


class SessionLog:
    """The requests of one session, in order, with block digests interned as small integers
    (so a part file stores a session's shapes compactly)."""

    def __init__(self) -> None:
        self._ids: dict[bytes, int] = {}
        self.shapes: list[RequestShape] = []

    def add(
        self,
        kind: str,
        blocks: Sequence[tuple[bytes, int]],
        breakpoints: Iterable[int] = (),
        extra: int = 0,
        output: int = 0,
        at: float = 0.0,
    ) -> RequestShape:
        ids = tuple(self._ids.setdefault(digest, len(self._ids)) for digest, _ in blocks)
        shape = RequestShape(
            kind, ids, tuple(t for _, t in blocks), tuple(sorted(set(breakpoints))), extra, output, at
        )
        self.shapes.append(shape)
        return shape

    def to_json(self) -> list[dict[str, Any]]:
        return [shape.to_json() for shape in self.shapes]


@dataclass(frozen=True, slots=True)
class Billed:
    """One request's prompt as billed: read from the cache, written to it, and the rest."""

    prompt: int
    cached: int = 0
    written: int = 0  # Anthropic cache writes (the rest of ``prompt - cached`` is uncached)


def _common_blocks(a: Sequence[int], b: Sequence[int]) -> int:
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


def _openai(shapes: Sequence[RequestShape], horizon: int, ttl: float) -> list[Billed]:
    recent: deque[tuple[tuple[int, ...], float]] = deque(maxlen=horizon)
    billed = []
    for shape in shapes:
        live = (ids for ids, at in recent if shape.at - at <= ttl)
        common = max((_common_blocks(ids, shape.ids) for ids in live), default=0)
        prefix = sum(shape.tokens[:common])
        cached = prefix // OPENAI_INCREMENT * OPENAI_INCREMENT if prefix >= MIN_CACHED_TOKENS else 0
        billed.append(Billed(shape.prompt, cached))
        recent.append((shape.ids, shape.at))
    return billed


def _anthropic(
    shapes: Sequence[RequestShape], horizon: int, client_breakpoint: bool, ttl: float
) -> list[Billed]:
    # A cached prefix -> the request that last used it, and when.
    entries: dict[tuple[int, ...], tuple[int, float]] = {}
    billed = []
    for index, shape in enumerate(shapes):
        entries = {
            key: (used, at)
            for key, (used, at) in entries.items()
            if index - used <= horizon and shape.at - at <= ttl
        }
        marks = set(shape.breakpoints)
        if client_breakpoint and shape.ids:
            marks.add(len(shape.ids) - 1)
        totals = list(accumulate(shape.tokens))
        hit = -1
        for mark in sorted(marks):
            for end in range(mark, max(-1, mark - ANTHROPIC_LOOKBACK - 1), -1):
                if shape.ids[: end + 1] in entries:
                    hit = max(hit, end)
                    break
        cached = totals[hit] if hit >= 0 else 0
        if hit >= 0:
            entries[shape.ids[: hit + 1]] = (index, shape.at)
        cacheable = [mark for mark in marks if totals[mark] >= MIN_CACHED_TOKENS]
        last = max(cacheable, default=-1)
        written = totals[last] - cached if last > hit else 0
        for mark in cacheable:
            entries[shape.ids[: mark + 1]] = (index, shape.at)
        billed.append(Billed(shape.prompt, cached, written))
    return billed


def simulate(
    shapes: Sequence[RequestShape],
    rule: str,
    horizon: int = DEFAULT_HORIZON,
    client_breakpoint: bool = True,
    ttl: float = DEFAULT_TTL,
) -> list[Billed | None]:
    """Each request of one session as billed under ``rule`` (None for question probes).

    ``client_breakpoint`` (Anthropic): the client marks its last message, as Claude Code and
    the SDKs' agents do (the replay's Messages door writes no breakpoint of its own; the
    proxy's, at the end of a compacted prefix, is in the body)."""
    if rule not in RULES:
        raise ValueError(f"unknown cache rule {rule!r}")
    billable = [s for s in shapes if s.kind != "question"]
    if rule == "openai":
        done = _openai(billable, horizon, ttl)
    elif rule == "anthropic":
        done = _anthropic(billable, horizon, client_breakpoint, ttl)
    else:
        done = [Billed(s.prompt) for s in billable]
    results = iter(done)
    return [None if s.kind == "question" else next(results) for s in shapes]


@dataclass(frozen=True, slots=True)
class Rates:
    """Prices relative to the model's full input price (a full-price input token is 1)."""

    cached_input: float = 1.0
    cache_write: float = 1.0
    output: float = 4.0
    summarizer_input: float = 1.0
    summarizer_output: float = 4.0


@dataclass(slots=True)
class Tally:
    requests: int = 0
    prompt: int = 0
    cached: int = 0
    written: int = 0
    output: int = 0

    def add(self, billed: Billed, output: int) -> None:
        self.requests += 1
        self.prompt += billed.prompt
        self.cached += billed.cached
        self.written += billed.written
        self.output += output

    def effective(self, rates: Rates) -> float:
        """In full-price input tokens."""
        uncached = self.prompt - self.cached - self.written
        return (
            uncached
            + self.written * rates.cache_write
            + self.cached * rates.cached_input
            + self.output * rates.output
        )


@dataclass(slots=True)
class Tallies:
    trajectory: Tally = field(default_factory=Tally)  # steps and their read rounds
    answering: Tally = field(default_factory=Tally)  # answers and their read rounds
    read_rounds: Tally = field(default_factory=Tally)  # every read round (of either)

    def add_session(
        self,
        shapes: Sequence[RequestShape],
        rule: str,
        horizon: int,
        client_breakpoint: bool,
        ttl: float = DEFAULT_TTL,
    ) -> None:
        billed_shapes = simulate(shapes, rule, horizon, client_breakpoint, ttl)
        for shape, billed in zip(shapes, billed_shapes, strict=True):
            if billed is None:
                continue
            group = self.trajectory if shape.kind in ("step", "step_read") else self.answering
            group.add(billed, shape.output)
            if shape.kind.endswith("_read"):
                self.read_rounds.add(billed, shape.output)
