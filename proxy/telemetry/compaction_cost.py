"""The compaction's own cost: the summarizer's tokens a session spent, apart from its prompt.

Two sources, as Anthropic reports a compaction's cost apart from the prompt's:

- **point**: the summary a compaction point made by calling the summarizer (a point that used a
  prepared summary spent nothing itself: the preparation did);
- **preparation**: summaries prepared ahead (``proxy/summaries/prepared.py``), used or not: each
  is paid whether a point takes it, drops it as stale, or the session ends first.

The rule: each spend is on exactly one event. A point's tokens are on its request's event
(``CompactionCost``, a finisher). A preparation finishes in the background, between requests,
perhaps after the session's last one or while another replica serves the session: so when it
finishes (its summarizer answered, whatever came of it) it gets an event of its own, at once,
in the process that paid for it (``preparation_event``: ``kind: "preparation"``, its tokens
under ``compaction_cost.preparation``, no request, no trigger), and no request's event carries
it. A request's event has no ``kind`` (the events of version 1 without one are requests'), so
readers that count requests or compaction points leave a preparation's event out and readers
that sum ``compaction_cost`` take it in: the events of a session add up to what its compaction
cost, and the metrics (``compaction_proxy_compaction_tokens``, counted when spent) agree.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from policies.facts import SummaryFact
from proxy.state.sessions import client_session_label
from proxy.telemetry.events import SCHEMA_VERSION, new_event_id
from proxy.telemetry.exchange import Exchange

# Label of a request outside canary mode.
NO_ARM = "none"
# No tokens: (input, output).
NOTHING = (0, 0)
# The ``kind`` of a preparation's own event (a request's event has none).
PREPARATION = "preparation"


def arm_label(arm: str | None) -> str:
    return arm or NO_ARM


@dataclass(frozen=True, slots=True)
class PreparedFor:
    """Whose a preparation is: what the request that started it says about its session, for
    the preparation's own event (its tenant and session are the preparation's) and the canary
    book (``canary_key``, ``arm``; ``model``: the unit of the arm's cost)."""

    arm: str | None = None
    canary_key: str = ""
    policy: str = ""
    mode: str = ""
    door: str = ""
    client_session: bytes | None = None
    model: object = None

    @classmethod
    def of(cls, exchange: Exchange) -> PreparedFor:
        return cls(
            arm=exchange.arm,
            canary_key=exchange.canary_key,
            policy=exchange.policy,
            mode=exchange.mode,
            door=exchange.route,
            client_session=exchange.client_session,
        )


@dataclass(frozen=True, slots=True)
class Preparation:
    """A preparation that finished: the summarizer's tokens it spent (used or not)."""

    tenant: str
    session: str
    whose: PreparedFor
    input_tokens: int
    output_tokens: int


class Preparations:
    """Where a finished preparation goes, at once: each listener (its own event, the canary
    book), added as the app is built. A listener that fails costs the others nothing."""

    def __init__(self, log: Any = None) -> None:
        self.listeners: list[Callable[[Preparation], None]] = []
        self.log = log

    def finished(self, preparation: Preparation) -> None:
        if not (preparation.input_tokens or preparation.output_tokens):
            return  # nothing spent (a failure before the summarizer answered): nothing to record
        for listener in self.listeners:
            try:
                listener(preparation)
            except Exception as exc:  # a lost record is logged, never a lost preparation
                if self.log is not None:
                    self.log.warning("preparation_record_failed", error=type(exc).__name__)


def preparation_event(preparation: Preparation) -> dict[str, Any]:
    """A preparation's own event: its session's (tenant, session, client's id, policy, mode,
    door, arm, model, as the request that started it had them), its ``compaction_cost`` by
    source, and none of a request's figures (no ``request``, ``trigger`` or tokens sent)."""
    whose = preparation.whose
    event: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "event_id": new_event_id(),
        "time": time.time(),
        "kind": PREPARATION,
        "tenant": preparation.tenant,
        "session": preparation.session,
        "model": whose.model if isinstance(whose.model, str) else None,
        "mode": whose.mode,
        # The policy its session is kept under (the key's end), as its requests' events have it.
        "policy": preparation.session.partition(":")[2] or whose.policy,
        "dialect": whose.door,
        "trigger": None,
        "request": None,
        "compaction_cost": own_cost(NOTHING, (preparation.input_tokens, preparation.output_tokens)),
    }
    if whose.client_session:
        event["client_session"] = client_session_label(whose.client_session)
    if whose.arm is not None:
        event["arm"] = whose.arm
    return event


def point_tokens(summary: SummaryFact | None) -> tuple[int, int]:
    """The summarizer's tokens a compaction point spent itself: none for the ledger, nor for a
    prepared summary it used (its preparation paid, and was counted then)."""
    if summary is None or summary.model == "ledger" or summary.prepared == "used":
        return 0, 0
    return int(summary.input_tokens), int(summary.output_tokens)


def own_cost(point: tuple[int, int], preparation: tuple[int, int]) -> dict[str, Any]:
    """The event's ``compaction_cost``: the tokens in all, and by source."""
    return {
        "input_tokens": point[0] + preparation[0],
        "output_tokens": point[1] + preparation[1],
        "point": {"input_tokens": point[0], "output_tokens": point[1]},
        "preparation": {"input_tokens": preparation[0], "output_tokens": preparation[1]},
    }


def cost_tokens(record: Any) -> tuple[int, int]:
    """The input and output tokens of an event's ``compaction_cost`` (0, 0 without one)."""
    if not isinstance(record, dict):
        return 0, 0
    return int(record.get("input_tokens") or 0), int(record.get("output_tokens") or 0)


def priced_usd(
    input_tokens: int, output_tokens: int, input_price: float | None, output_price: float | None
) -> float | None:
    """The summarizer's tokens in US dollars at its model's prices per million (an output
    price missing: four times the input price, the usual ratio); None without an input price,
    unless no token was spent (nothing costs nothing at any price)."""
    if not (input_tokens or output_tokens):
        return 0.0
    if input_price is None:
        return None
    output = output_price if output_price is not None else 4.0 * input_price
    return (input_tokens * input_price + output_tokens * output) / 1e6


class CompactionCost:
    """A finisher: the request's ``compaction_cost`` (the summarizer's tokens its point spent),
    for the event, the canary book and the metrics to read once the record is sealed. A
    preparation's tokens are never here: they are on its own event (``preparation_event``)."""

    def finish(self, exchange: Exchange) -> None:
        outcome = exchange.outcome
        point = point_tokens(outcome.facts.summary) if outcome is not None else NOTHING
        if point != NOTHING:
            exchange.compaction_cost = own_cost(point, NOTHING)
