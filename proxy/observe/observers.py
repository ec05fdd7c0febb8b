"""What happens once a response is out.

First the finishing steps complete the request's ``Exchange`` (``TokenCalibration``: the prompt
tokens the answer reported, for a model counted with a factor); then the edge seals it, and each
observer reads the sealed record (``CompactionRecord``: metrics, the versioned event, a shadow
comparison; ``RequestMetrics``; ``AccessLog``). Observers only read, so none depends on
another's order. One that fails costs a metric and a log line, never the request (it was
answered).
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from policies.pipeline import PolicyOutcome
from proxy.dialects.base import Dialect
from proxy.state.checkpoint_states import CheckpointState
from proxy.state.sessions import client_session_label
from proxy.state.token_factors import TokenFactors
from proxy.telemetry.compaction_cost import NOTHING, arm_label, own_cost
from proxy.telemetry.events import CheckpointJson, EventSink, build_event, checkpoint_json
from proxy.telemetry.exchange import Exchange, ShadowCompare, status_class
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.shadow import Decide, ShadowComparer

# Sends a compacted body upstream for a shadow comparison: (dialect, url, headers, body, tenant).
AskUpstream = Callable[
    [str, str, list[tuple[bytes, bytes]], dict[str, Any], str, Any], Awaitable[tuple[int, bytes]]
]


class Observer(Protocol):
    def observe(self, exchange: Exchange) -> None:
        """Read the sealed record of an answered request (a write raises)."""
        ...


class Finisher(Protocol):
    def finish(self, exchange: Exchange) -> None:
        """Complete the record of an answered request, before it is sealed."""
        ...


class CompactionRecord:
    """Compaction metrics and the versioned event (after a shadow comparison, if one runs)."""

    def __init__(
        self,
        *,
        metrics: Metrics,
        events: EventSink,
        shadow: ShadowComparer,
        ask: AskUpstream,
        decide: Callable[[str], Decide],
        policy_meta: dict[str, tuple[str, str]],
        record_skipped: bool,
        log: Any = None,
    ) -> None:
        self.log = log
        self.metrics = metrics
        self.events = events
        self.shadow = shadow
        self.ask = ask
        self.decide = decide
        self.policy_meta = policy_meta
        self.record_skipped = record_skipped
        self.checkpoints = CheckpointJson()

    def observe(self, exchange: Exchange) -> None:
        outcome = exchange.outcome
        if outcome is None:
            return
        # An agent's own compaction request is always recorded, even when sent as it came (a
        # preparation's tokens are never a request's: it records its own event).
        agent_compaction = exchange.dialect_notes.get("agent_compaction")
        if not (outcome.mechanisms or outcome.trigger or self.record_skipped or agent_compaction):
            return
        self._count(exchange, outcome)
        # A request the policy left alone gets a light record: no checkpoint, no details.
        light = not (outcome.mechanisms or outcome.trigger)
        state = None if light else self.checkpoints.state(exchange.session, outcome.checkpoint)
        event = self._event(exchange, outcome, light, state)
        compare = exchange.compare
        if compare is not None and exchange.status == 200:
            self._compare(exchange, compare, event, state)
            return
        self.events.emit(event, state)

    def _count(self, exchange: Exchange, outcome: PolicyOutcome) -> None:
        m = self.metrics
        if outcome.trigger:
            m.compaction_points.labels(exchange.policy, outcome.trigger).inc()
            for mechanism in outcome.mechanisms or ("none",):
                m.compactions.labels(exchange.policy, mechanism, outcome.trigger).inc()
        if outcome.offloads:
            m.offloaded.labels(exchange.policy).inc(len(outcome.offloads))
            m.offloaded_bytes.labels(exchange.policy).inc(exchange.offloaded_bytes)
        landing = outcome.facts.summarize
        if landing is not None and landing.no_read_room_first:
            # Once per session: what the policy cannot make small leaves no room to read.
            m.no_read_room.labels(exchange.policy).inc()
            if self.log is not None:
                self.log.warning(
                    "no_read_room",
                    request_id=exchange.request_id,
                    session=exchange.session,
                    policy=exchange.policy,
                    reason=landing.target_missed,
                    free=landing.no_read_room,
                )
        own = exchange.compaction_cost
        if own is not None:
            # A preparation's tokens were counted when spent: the point's own are counted here.
            arm = arm_label(exchange.arm)
            m.compaction_tokens.labels("input", "point", arm).inc(own["point"]["input_tokens"])
            m.compaction_tokens.labels("output", "point", arm).inc(own["point"]["output_tokens"])
        summary = outcome.facts.summary
        if summary is not None:
            result = "ledger" if summary.model == "ledger" else "ok"
            m.summaries.labels("fallback" if summary.fallback_reason else result).inc()
            m.summary_seconds.observe(summary.seconds)
            # A prepared summary (or the ledger standing in for one) was not waited for.
            m.summary_wait_seconds.observe(0.0 if summary.prepared else summary.seconds)

    def _event(
        self, exchange: Exchange, outcome: PolicyOutcome, light: bool, state: CheckpointState | None
    ) -> dict[str, Any]:
        version, config_hash = self.policy_meta.get(exchange.policy, ("", ""))
        event = build_event(
            request_id=exchange.request_id,
            tenant=exchange.tenant,
            session=exchange.session,
            model=exchange.model,
            mode=exchange.mode,
            policy=exchange.policy,
            policy_version=version,
            policy_hash=config_hash,
            outcome=outcome,
            messages_before=exchange.messages_before,
            reads=exchange.reads,
            messages_after=exchange.messages_after,
            offloaded_bytes=exchange.offloaded_bytes,
            session_fork=exchange.session_fork,
            # Not encoded for a light record, which drops it below.
            checkpoint_json=b"null" if light else checkpoint_json(outcome.checkpoint, state),
        )
        event["dialect"] = exchange.route
        # The upstream's answer to the view (a failed request's event says it failed).
        event["status"] = exchange.status
        client_session = client_session_label(exchange.client_session) if exchange.client_session else None
        if client_session:
            # The id the client named the session with, shown beside the proxy's hash of it;
            # the event is its tenant's, as ever.
            event["client_session"] = client_session
        if exchange.arm is not None:
            event["arm"] = exchange.arm
        # The summarizer's tokens of this point: the compaction's own cost, apart from the
        # prompt (a preparation's are on its own event, compaction_cost.py).
        event["compaction_cost"] = exchange.compaction_cost or own_cost(NOTHING, NOTHING)
        if exchange.view_changed:
            event["view_changed"] = list(exchange.view_changed)
        if exchange.token_count is not None:
            event["token_count"] = exchange.token_count
        if exchange.dialect_notes:
            event["dialect_notes"] = exchange.dialect_notes
        if exchange.context_retry is not None:
            event["context_retry"] = exchange.context_retry
        if light:
            event.pop("checkpoint", None)
            event["details"] = {}
        return event

    def _compare(
        self,
        exchange: Exchange,
        compare: ShadowCompare,
        event: dict[str, Any],
        state: CheckpointState | None,
    ) -> None:
        """The shadow comparison runs in the background; its result completes the event."""
        policy = exchange.policy

        def compared(result: dict[str, Any]) -> None:
            label = "error" if result["error"] else ("diverged" if result["diverged"] else "same")
            self.metrics.shadow_compares.labels(policy, label).inc()
            self.events.emit({**event, "shadow_compare": result}, state)

        dialect, url, headers, tenant = compare.dialect, compare.url, compare.headers, exchange.tenant

        async def ask(body: dict[str, Any]) -> tuple[int, bytes]:
            return await self.ask(dialect, url, headers, body, tenant, compare.target)

        self.shadow.start(
            ask, compare.body, bytes(compare.captured), compare.captured_sse, compared, self.decide(dialect)
        )


class TokenCalibration:
    """For a model counted with a token factor: the prompt tokens the upstream reported for the
    view, learned into the factor (``proxy/state/token_factors.py``) and noted for the event."""

    def __init__(self, factors: TokenFactors, dialects: Mapping[str, Dialect]) -> None:
        self.factors = factors
        self.dialects = dialects

    def finish(self, exchange: Exchange) -> None:
        outcome, factor = exchange.outcome, exchange.token_factor
        dialect = self.dialects.get(exchange.route)
        if outcome is None or factor is None or dialect is None:
            return
        # What went upstream: the view (enforce) or the client's own request (shadow).
        counted = outcome.tokens_after if exchange.mode == "enforce" else outcome.tokens_before
        reported = 0
        if exchange.status == 200:
            reads = exchange.reads
            if reads is not None and reads.usage_per_round and reads.round_tokens:
                counted = reads.round_tokens[0]  # the first round: the view and the read tool
                reported = dialect.prompt_tokens(reads.usage_per_round[0])
            elif exchange.answer_head:
                reported = dialect.reported_prompt_tokens(bytes(exchange.answer_head), exchange.answer_sse)
        exchange.answer_head = bytearray()
        # A request with tools (the read tool included) gets the provider's fixed tool prompt.
        tools = bool(exchange.dialect_notes.get("tools", True)) or exchange.reads is not None
        # Images and documents are estimates: their requests would teach the factor a wrong ratio.
        sample = reported and not exchange.dialect_notes.get("media")
        ratio = (
            self.factors.observe(exchange.model, counted, reported, tools, tenant=exchange.tenant)
            if sample
            else None
        )
        fixed = self.factors.fixed_for(exchange.model) if tools else 0
        exchange.token_count = {
            "counted": counted,
            "factor": factor,
            "fixed": fixed,
            "estimated": round(counted * factor) + fixed,
            "reported": reported or None,
            "ratio": round(ratio, 4) if ratio is not None else None,
        }


_MODELS_AT_MOST = 64


class RequestMetrics:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        # Each label combination's series, found once: ``labels()`` validates and locks on
        # every call, and a request touches six series.
        self._series: dict[tuple[str, str, str, str], _RequestSeries] = {}
        # Model names come from clients: a bounded number get a series of their own.
        self._models: dict[str, Any] = {}

    def _series_for(self, exchange: Exchange) -> _RequestSeries:
        key = (exchange.route, exchange.policy, exchange.mode, status_class(exchange.status))
        found = self._series.get(key)
        if found is None:
            m = self.metrics
            route, policy, mode, _ = key
            found = _RequestSeries(
                requests=m.requests.labels(*key),
                upstream_seconds=m.upstream_seconds.labels(route),
                overhead_seconds=m.overhead_seconds.labels(route),
                tokens_before=m.tokens_before.labels(policy, mode),
                tokens_after=m.tokens_after.labels(policy, mode),
                tokens_saved=m.tokens_saved.labels(policy, mode),
            )
            if len(self._series) < 4096:  # label values come from configuration, not clients
                self._series[key] = found
        return found

    def _model_series(self, model: str) -> Any:
        found = self._models.get(model)
        if found is None:
            if len(self._models) < _MODELS_AT_MOST:
                found = self._models[model] = self.metrics.model_requests.labels(model[:100])
            else:
                found = self.metrics.model_requests.labels("other")
        return found

    def observe(self, exchange: Exchange) -> None:
        total = time.perf_counter() - exchange.started
        series = self._series_for(exchange)
        series.requests.inc()
        if isinstance(exchange.model, str):
            self._model_series(exchange.model).inc()
        if exchange.upstream_seconds:
            series.upstream_seconds.observe(exchange.upstream_seconds)
        series.overhead_seconds.observe(max(0.0, total - exchange.upstream_seconds))
        if exchange.tokens_before is not None and exchange.tokens_after is not None:
            series.tokens_before.observe(exchange.tokens_before)
            series.tokens_after.observe(exchange.tokens_after)
            saved = exchange.tokens_before - exchange.tokens_after
            if saved > 0:
                series.tokens_saved.inc(saved)


@dataclass(frozen=True, slots=True)
class _RequestSeries:
    """The series one request's metrics go to."""

    requests: Any
    upstream_seconds: Any
    overhead_seconds: Any
    tokens_before: Any
    tokens_after: Any
    tokens_saved: Any


class AccessLog:
    """One structured line per request: no key, no header, no content."""

    def __init__(self, log: Any) -> None:
        self.log = log
        self.pid = os.getpid()

    def observe(self, exchange: Exchange) -> None:
        total = time.perf_counter() - exchange.started
        self.log.info(
            "request",
            request_id=exchange.request_id,
            route=exchange.route,
            method=exchange.method,
            status=exchange.status,
            policy=exchange.policy,
            mode=exchange.mode,
            stream=exchange.stream,
            tokens_before=exchange.tokens_before,
            tokens_after=exchange.tokens_after,
            upstream_s=round(exchange.upstream_seconds, 6),
            overhead_s=round(max(0.0, total - exchange.upstream_seconds), 6),
            error=exchange.error,
            read_rounds=exchange.read_rounds,
            mechanisms=list(exchange.mechanisms),
            trigger=exchange.trigger,
            checkpoint_dropped=exchange.checkpoint_dropped,
            skipped=exchange.skipped,
            pid=self.pid,
        )
