"""What one canary request came to: ``CanaryRecord`` (an observer) turns a finished request
into its figures (usage as the provider reported it, errors by whose doing they are, reads,
repeated calls, the agent's own compaction, how the answer ended, its cost), counts them in
the metrics and, in the background, adds them to the session's figures in the book."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import orjson

from proxy.canary.gate import Prices, own_cost
from proxy.canary.outcome import add_usage, outcome_kind, usage_objects
from proxy.canary.store import CanaryBook
from proxy.config.settings import Settings
from proxy.dialects.base import Dialect, Usage
from proxy.telemetry.compaction_cost import Preparation, cost_tokens
from proxy.telemetry.exchange import Exchange
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.session_summary import PriceColumn


class CanaryPrices:
    """Each model's four prices from the ``models`` table (first pattern that sets each);
    ``summarizer``: the summarizer model's, which the compaction's own tokens cost."""

    def __init__(self, settings: Settings) -> None:
        models = settings.models
        self._lookups = {
            name: PriceColumn(models, name)
            for name in ("input_price", "cached_input_price", "cache_write_price", "output_price")
        }
        self.summarizer = self.of(settings.summarizer.model)

    def of(self, model: object) -> Prices:
        get = {name: lookup.per_million(model) for name, lookup in self._lookups.items()}
        return Prices(
            get["input_price"], get["cached_input_price"], get["cache_write_price"], get["output_price"]
        )


def request_figures(
    exchange: Exchange, dialect: Dialect, prices: Prices, summarizer: Prices | None = None
) -> tuple[dict[str, float], str | None]:
    """The request's figures (``proxy.canary.gate.COUNTED``) and how its answer ended; its
    cost is the prompt's and the compaction's own (the summarizer's tokens this request's event
    carries, ``proxy/telemetry/compaction_cost.py``, at ``summarizer``'s prices)."""
    usage, tool_call, body = Usage(), False, b""
    reads = exchange.reads
    if reads is not None:
        for round_usage in reads.usage_per_round:
            usage = add_usage(usage, dialect.billed([round_usage]))
        tool_call = dialect.tool_call_marker in _final_bytes(reads.final_answer)
    capture = exchange.canary_capture
    if capture is not None:
        # What the client was sent: its usage counts unless the read loop's rounds did.
        body = capture.raw()
        if reads is None or not reads.usage_per_round:
            usage = add_usage(usage, dialect.billed(usage_objects(body)))
        tool_call = tool_call or capture.tool_call
    kind = outcome_kind(exchange.status, exchange.error, body)
    own_input, own_output = cost_tokens(exchange.compaction_cost)
    own = own_cost(own_input, own_output, summarizer or prices, prices) if own_input or own_output else 0.0
    counted = {
        "requests": 1,
        "prompt": usage.prompt,
        "cached": usage.cached,
        "written": usage.written,
        "output": usage.output,
        # Only the policy's doing counts against an arm (``outcome_kind``): a client's own 4xx
        # and the upstream's failures are kept apart, so a client cannot make them the policy's.
        "context_errors": int(kind == "context"),
        "errors": int(kind == "view"),
        "client_errors": int(kind == "client"),
        "upstream_errors": int(kind == "upstream"),
        "reads": len(reads.reads) if reads is not None else 0,
        "repeats": exchange.repeats,
        "agent_compactions": int("agent_compaction" in exchange.dialect_notes),
        "cost": own
        + prices.cost(usage, cached_ratio=dialect.cached_input_ratio, write_ratio=dialect.cache_write_ratio),
        "compaction_input": own_input,
        "compaction_output": own_output,
        "compaction_cost": own,
    }
    ending = None if kind != "ok" else ("tool" if tool_call else "final")
    return counted, ending


def _final_bytes(answer: Any) -> bytes:
    return orjson.dumps(answer) if answer is not None else b""


class CanaryRecord:
    def __init__(
        self,
        metrics: Metrics,
        book: CanaryBook,
        prices: CanaryPrices,
        dialects: Mapping[str, Dialect],
        log: Any,
    ) -> None:
        self.dialects = dialects
        self.metrics = metrics
        self.book = book
        self.prices = prices
        self.log = log
        self.pending: set[asyncio.Task[None]] = set()

    def observe(self, exchange: Exchange) -> None:
        arm = exchange.arm
        dialect = self.dialects.get(exchange.route)
        if arm is None or dialect is None:
            return
        counted, ending = request_figures(
            exchange, dialect, self.prices.of(exchange.model), self.prices.summarizer
        )
        m = self.metrics
        m.canary_requests.labels(arm, exchange.route).inc()
        for kind, key in (
            ("prompt", "prompt"),
            ("cached", "cached"),
            ("cache_write", "written"),
            ("output", "output"),
        ):
            if counted[key]:
                m.canary_tokens.labels(arm, kind).inc(counted[key])
        for outcome, key in (
            ("context_error", "context_errors"),
            ("view_error", "errors"),
            ("client_error", "client_errors"),
            ("upstream_error", "upstream_errors"),
            ("read", "reads"),
            ("repeat", "repeats"),
            ("agent_compaction", "agent_compactions"),
        ):
            if counted[key]:
                m.canary_outcomes.labels(arm, outcome).inc(counted[key])
        if ending is not None:
            m.canary_outcomes.labels(arm, "final_answer" if ending == "final" else "tool_call").inc()
        m.canary_cost.labels(arm).inc(counted["cost"])
        task = asyncio.ensure_future(self._add(exchange.canary_key, arm, counted, ending))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    def preparation(self, preparation: Preparation) -> None:
        """A summary prepared ahead for a canary session finished: its tokens are its arm's cost
        (the compaction's own, at the summarizer's prices, in the unit of the requests' cost of
        the model the session asked for), added to the session's figures as no request."""
        whose = preparation.whose
        if whose.arm is None or not whose.canary_key:
            return
        own_input, own_output = preparation.input_tokens, preparation.output_tokens
        own = own_cost(own_input, own_output, self.prices.summarizer, self.prices.of(whose.model))
        counted = {"compaction_input": own_input, "compaction_output": own_output, "compaction_cost": own}
        self.metrics.canary_cost.labels(whose.arm).inc(own)
        task = asyncio.ensure_future(self._add(whose.canary_key, whose.arm, {**counted, "cost": own}, None))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _add(self, key: str, arm: str, counted: dict[str, float], ending: str | None) -> None:
        try:
            await self.book.add(key, arm, counted, ending, time.time())
        except Exception as exc:  # a lost figure is logged, never a failed request
            self.log.warning("canary_record_failed", error=type(exc).__name__)
