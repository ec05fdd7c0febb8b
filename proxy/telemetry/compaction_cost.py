"""The compaction's own cost: the summarizer's tokens a session spent, apart from its prompt.

Two sources, as Anthropic reports a compaction's cost apart from the prompt's:

- **point**: the summary a compaction point made by calling the summarizer (a point that used a
  prepared summary spent nothing itself: the preparation did);
- **preparation**: summaries prepared ahead (``proxy/summaries/prepared.py``), used or not: each
  is paid whether a point takes it, drops it as stale, or the session ends first.

A preparation finishes in the background, between requests; its tokens wait in
``PreparationSpend`` under the session until the session's next request in this process takes
them (``CompactionCost``, a finisher), and that request's event carries them. So every event's
``compaction_cost`` is the point's own tokens plus the preparations' since the session's last
event, and the events of a session add up to what its compaction cost. The metrics count a
preparation's tokens when they are spent (``compaction_proxy_compaction_tokens``), so they also
hold the preparations of a session that sent no request afterwards (its end, or a replica that
served the rest).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from policies.facts import SummaryFact
from proxy.telemetry.exchange import Exchange

# Label of a request outside canary mode.
NO_ARM = "none"
# No tokens: (input, output).
NOTHING = (0, 0)


def arm_label(arm: str | None) -> str:
    return arm or NO_ARM


class PreparationSpend:
    """The summarizer's tokens spent preparing summaries ahead, per session, until a request of
    the session takes them; bounded to the ``sessions`` most recently added (the oldest
    dropped: the metrics still have them)."""

    def __init__(self, sessions: int = 10_000) -> None:
        self.sessions = sessions
        self._spent: OrderedDict[str, tuple[int, int]] = OrderedDict()

    def add(self, session: str, input_tokens: int, output_tokens: int) -> None:
        if not (input_tokens or output_tokens):
            return
        old_input, old_output = self._spent.get(session, (0, 0))
        self._spent[session] = (old_input + input_tokens, old_output + output_tokens)
        self._spent.move_to_end(session)
        while len(self._spent) > self.sessions:
            self._spent.popitem(last=False)

    def pending(self, session: str) -> bool:
        return session in self._spent

    def take(self, session: str) -> tuple[int, int]:
        return self._spent.pop(session, (0, 0))


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
    """A finisher: the request's ``compaction_cost`` (the point's own tokens and the
    preparations the session spent since its last request here), for the event, the canary
    book and the metrics to read once the record is sealed."""

    def __init__(self, spend: PreparationSpend | None) -> None:
        self.spend = spend

    def finish(self, exchange: Exchange) -> None:
        outcome = exchange.outcome
        point = point_tokens(outcome.facts.summary) if outcome is not None else NOTHING
        taken = self.spend.take(exchange.session) if self.spend is not None and exchange.session else NOTHING
        if point != NOTHING or taken != NOTHING:
            exchange.compaction_cost = own_cost(point, taken)
