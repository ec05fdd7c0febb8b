"""The canary at run time: which arm a request is in, what it came to, and the gate's judge.

- ``CanaryArms`` (the route asks it): the session's arm by hash; while paused, a session is
  treated only if the book already has it treated (sessions in flight keep their arm).
- ``CanaryRecord`` (an observer): the request's figures (usage as the provider reported it,
  errors, reads, repeated calls, the agent's own compaction, how the answer ended, its cost)
  into the metrics and, in the background, into the session's figures in the book.
- ``CanaryJudge``: every ``evaluate_every_seconds`` the figures since the epoch, split by arm
  and judged; on a breach it pauses (first replica wins), records a rollback event with the
  figures, counts it and logs one line.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import orjson

from proxy.canary.gate import Prices, arm_of, split_arms
from proxy.canary.outcome import add_usage, outcome_kind, repeated_calls, usage_objects
from proxy.canary.store import CanaryBook
from proxy.canary.verdict import judge
from proxy.config.sections import CanarySettings
from proxy.config.settings import Settings
from proxy.dialects.agent_compaction import agent_compaction
from proxy.dialects.base import Dialect, Usage
from proxy.state.sessions import root_session
from proxy.telemetry.events import EventSink
from proxy.telemetry.exchange import AnswerCapture, Exchange
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.session_summary import PriceColumn
from proxy.wire.forwarding import header_value

Headers = list[tuple[bytes, bytes]]
_TOKEN_KINDS = (("prompt", "prompt"), ("cached", "cached"), ("cache_write", "written"), ("output", "output"))


class CanaryArms:
    def __init__(self, settings: CanarySettings, book: CanaryBook) -> None:
        self.settings = settings
        self.book = book
        self.paused = False
        self.epoch = 0.0

    def observe_state(self, state: Mapping[str, Any]) -> None:
        self.paused = bool(state.get("paused"))
        self.epoch = float(state.get("epoch") or 0.0)

    async def arm_for(self, tenant: str, session: str) -> str:
        arm = arm_of(self.settings.salt, tenant, session, self.settings.share)
        if arm == "treated" and self.paused:
            return "treated" if await self.book.arm(f"{tenant}\x1f{session}") == "treated" else "holdout"
        return arm


async def place_in_arm(
    canary: CanaryArms | None,
    exchange: Exchange,
    headers: Headers,
    tenant: str,
    neutral: Mapping[str, Any] | None,
    tool_call_marker: bytes,
) -> str:
    """The request's arm, and what the canary records of it from the request itself: the
    session's key (the client's ``X-Session-Id``, else the conversation's root), the answer's
    capture, the tool calls the agent repeats, and (in the holdout, which goes no further) the
    agent's own compaction request."""
    explicit = header_value(headers, b"x-session-id")
    key = explicit.decode("latin-1") if explicit else None
    messages = (neutral.get("messages") if neutral is not None else None) or []
    if key is None and neutral is not None:
        key = root_session(neutral, tenant)
    # A body only a worker process reads, sent without a session id, stays in the holdout.
    arm = await canary.arm_for(tenant, key) if key and canary is not None else "holdout"
    exchange.arm, exchange.canary_key = arm, f"{tenant}\x1f{key}"
    exchange.canary_capture = AnswerCapture(tool_call_marker)
    exchange.repeats = repeated_calls(messages)
    agent = agent_compaction(headers, messages) if arm == "holdout" else None
    if agent is not None:
        exchange.dialect_notes = {"agent_compaction": {"agent": agent}}
    return arm


class CanaryPrices:
    """Each model's four prices from the ``models`` table (first pattern that sets each)."""

    def __init__(self, settings: Settings) -> None:
        models = settings.models
        self._lookups = {
            name: PriceColumn(models, name)
            for name in ("input_price", "cached_input_price", "cache_write_price", "output_price")
        }

    def of(self, model: object) -> Prices:
        get = {name: lookup.per_million(model) for name, lookup in self._lookups.items()}
        return Prices(
            get["input_price"], get["cached_input_price"], get["cache_write_price"], get["output_price"]
        )


def request_figures(
    exchange: Exchange, dialect: Dialect, prices: Prices
) -> tuple[dict[str, float], str | None]:
    """The request's figures (``proxy.canary.gate.COUNTED``) and how its answer ended."""
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
        "cost": prices.cost(
            usage, cached_ratio=dialect.cached_input_ratio, write_ratio=dialect.cache_write_ratio
        ),
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
        counted, ending = request_figures(exchange, dialect, self.prices.of(exchange.model))
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

    async def _add(self, key: str, arm: str, counted: dict[str, float], ending: str | None) -> None:
        try:
            await self.book.add(key, arm, counted, ending, time.time())
        except Exception as exc:  # a lost figure is logged, never a failed request
            self.log.warning("canary_record_failed", error=type(exc).__name__)


async def canary_report(book: CanaryBook, settings: CanarySettings, now: float) -> dict[str, Any]:
    """The arms side by side since the epoch, the gate's verdict, and the pause."""
    state = await book.state()
    arms = split_arms(await book.sessions(float(state.get("epoch") or 0.0)))
    verdict = judge(arms, settings.gate)
    return {
        "time": now,
        "share": settings.share,
        "epoch": state.get("epoch") or 0.0,
        "paused": state.get("paused"),
        "verdict": verdict.state,
        "checks": [c.as_dict() for c in verdict.checks],
        "arms": {name: arm.summary(now, settings.idle_seconds) for name, arm in arms.items()},
        "min_sessions": settings.gate.min_sessions,
    }


class CanaryJudge:
    def __init__(
        self,
        settings: CanarySettings,
        book: CanaryBook,
        arms: CanaryArms,
        metrics: Metrics,
        events: EventSink,
        log: Any,
    ) -> None:
        self.settings = settings
        self.book = book
        self.arms = arms
        self.metrics = metrics
        self.events = events
        self.log = log

    async def evaluate(self) -> dict[str, Any]:
        report = await canary_report(self.book, self.settings, time.time())
        if report["verdict"] == "breach" and not report["paused"]:
            record = {
                "time": report["time"],
                "reason": [c["check"] for c in report["checks"] if c["breached"]],
                "checks": report["checks"],
                "arms": report["arms"],
            }
            if await self.book.pause(record):
                self._rolled_back(record)
            report["paused"] = (await self.book.state()).get("paused")
        self.arms.observe_state({"paused": report["paused"], "epoch": report["epoch"]})
        self.metrics.canary_paused.set(1 if report["paused"] else 0)
        return report

    def _rolled_back(self, record: dict[str, Any]) -> None:
        self.metrics.canary_rollbacks.inc()
        self.log.warning(
            "canary_paused",
            reason=",".join(record["reason"]),
            sessions={arm: figures["sessions"] for arm, figures in record["arms"].items()},
        )
        self.events.emit(
            {
                "schema_version": 1,
                "event_id": "ev_canary_" + str(int(record["time"] * 1000)),
                "time": record["time"],
                "tenant": "-",
                "session": "canary",
                "kind": "canary_rollback",
                "policy": "canary",
                **record,
            }
        )

    async def judge_forever(self) -> None:
        while True:
            try:
                await self.evaluate()
            except Exception as exc:  # judged again at the next interval
                self.log.warning("canary_judge_failed", error=type(exc).__name__)
            await asyncio.sleep(self.settings.evaluate_every_seconds)
