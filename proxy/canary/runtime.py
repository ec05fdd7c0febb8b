"""The canary at run time: which arm a request is in, and the gate's judge.

- ``CanaryArms`` (the route asks it): the session's arm by hash; while paused, a session is
  treated only if the book already has it treated (sessions in flight keep their arm).
- ``CanaryJudge``: every ``evaluate_every_seconds`` the figures since the epoch, split by arm
  and judged; on a breach it pauses (first replica wins, in the epoch judged), records a
  rollback event with the figures, counts it and logs one line; a pause the book lost it puts
  back.

What each request came to is ``proxy.canary.record``'s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from proxy.canary.gate import arm_of, split_arms
from proxy.canary.outcome import repeated_calls
from proxy.canary.store import CanaryBook
from proxy.canary.verdict import judge
from proxy.config.sections import CanarySettings
from proxy.dialects.agent_compaction import agent_compaction
from proxy.state.sessions import root_session
from proxy.telemetry.events import EventSink
from proxy.telemetry.exchange import AnswerCapture, Exchange
from proxy.telemetry.metrics import Metrics
from proxy.wire.forwarding import header_value

Headers = list[tuple[bytes, bytes]]


class CanaryArms:
    def __init__(
        self, settings: CanarySettings, book: CanaryBook, metrics: Metrics | None = None, log: Any = None
    ) -> None:
        self.settings = settings
        self.book = book
        self.metrics = metrics
        self.log = log
        self.paused = False
        self.epoch = 0.0

    def observe_state(self, state: Mapping[str, Any]) -> None:
        self.paused = bool(state.get("paused"))
        self.epoch = float(state.get("epoch") or 0.0)

    async def arm_for(self, tenant: str, session: str) -> str:
        arm = arm_of(self.settings.salt, tenant, session, self.settings.share)
        if arm == "treated" and self.paused:
            try:
                booked = await self.book.arm(f"{tenant}\x1f{session}")
            except Exception as exc:  # paused and unsure: the policy stays held back
                if self.metrics is not None:
                    self.metrics.canary_book_incidents.labels("arm_unread").inc()
                if self.log is not None:
                    self.log.warning("canary_arm_unread", error=type(exc).__name__)
                return "holdout"
            return "treated" if booked == "treated" else "holdout"
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


async def canary_report(book: CanaryBook, settings: CanarySettings, now: float) -> dict[str, Any]:
    """The arms side by side since the epoch, the gate's verdict, and the pause."""
    state = await book.state()
    figures = await book.sessions(float(state.get("epoch") or 0.0))
    arms = split_arms(figures.sessions)
    verdict = judge(arms, settings.gate)
    summaries = {name: arm.summary(now, settings.idle_seconds) for name, arm in arms.items()}
    return {
        "time": now,
        "share": settings.share,
        "epoch": state.get("epoch") or 0.0,
        "paused": state.get("paused"),
        # What the book held that could not be read (see ``proxy.canary.book_records``).
        "damaged": state.get("damaged") or [],
        "unreadable_sessions": figures.unreadable,
        "verdict": verdict.state,
        "checks": [c.as_dict() for c in verdict.checks],
        "arms": summaries,
        # What a treated session costs less than a holdout one, net of the compaction's own
        # cost (each arm's cost holds it): negative when the policy costs more than it saves.
        "saved_per_session": summaries["holdout"]["cost_per_session"]
        - summaries["treated"]["cost_per_session"],
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
        # The epoch and record of the last pause seen, to put it back if the book loses it.
        self.seen_pause: tuple[float, dict[str, Any]] | None = None

    async def evaluate(self) -> dict[str, Any]:
        report = await canary_report(self.book, self.settings, time.time())
        if report["damaged"] or report["unreadable_sessions"]:
            self.metrics.canary_book_incidents.labels("damaged").inc()
            self.log.warning(
                "canary_book_damaged", damaged=report["damaged"], sessions=report["unreadable_sessions"]
            )
        if report["paused"] is None and self._lost_pause(report):
            await self._restore(report)
        elif report["verdict"] == "breach" and not report["paused"]:
            record = {
                "time": report["time"],
                "reason": [c["check"] for c in report["checks"] if c["breached"]],
                "checks": report["checks"],
                "arms": report["arms"],
            }
            if await self.book.pause(record, report["epoch"]):
                self._rolled_back(record)
            report["paused"] = (await self.book.state()).get("paused")
        if report["paused"]:
            self.seen_pause = (report["epoch"], report["paused"])
        self.arms.observe_state({"paused": report["paused"], "epoch": report["epoch"]})
        self.metrics.canary_paused.set(1 if report["paused"] else 0)
        return report

    def _lost_pause(self, report: Mapping[str, Any]) -> bool:
        """A pause this replica saw is gone but no resume came: ``canary resume`` always starts
        a newer epoch, so an epoch no newer than the paused one means the book lost it (a Redis
        flushed or restarted without its file, an evicted key)."""
        if self.seen_pause is None:
            return False
        if float(report["epoch"]) > self.seen_pause[0]:
            self.seen_pause = None  # resumed: the pause was lifted on purpose
            return False
        return True

    async def _restore(self, report: dict[str, Any]) -> None:
        assert self.seen_pause is not None
        epoch, record = self.seen_pause
        if await self.book.pause({**record, "restored": report["time"]}, epoch):
            self.metrics.canary_book_incidents.labels("pause_restored").inc()
            self.log.warning("canary_pause_restored", reason=",".join(record.get("reason") or []))
        state = await self.book.state()
        report["paused"], report["epoch"] = state.get("paused"), state.get("epoch") or 0.0

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
                self.metrics.canary_book_incidents.labels("judge_failed").inc()
                self.log.warning("canary_judge_failed", error=type(exc).__name__)
            await asyncio.sleep(self.settings.evaluate_every_seconds)
