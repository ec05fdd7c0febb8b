"""The object graph of one app: every part built in dependency order, and how each is made."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from policies.pipeline import Policy, build_policies
from policies.tokens import TokenCounter
from proxy import package_version
from proxy.canary.record import CanaryPrices, CanaryRecord
from proxy.canary.runtime import CanaryArms, CanaryJudge
from proxy.canary.store import CanaryBook, make_canary_book
from proxy.config.sections import TracingSettings
from proxy.config.settings import Settings, policy_specs
from proxy.dialects import DOORS, Dialect, make_dialects
from proxy.dialects.hidden_rounds import HiddenRounds
from proxy.edge.v1 import Edge
from proxy.observe.observers import (
    AccessLog,
    CompactionRecord,
    Finisher,
    Observer,
    RequestMetrics,
    TokenCalibration,
)
from proxy.observe.otel_export import SpanExport
from proxy.read_loop.commands import LoopLimits
from proxy.read_loop.runner import LoopRunner
from proxy.read_tool.tool import ReadLimits, tool_schema
from proxy.route.compact_answer import CompactAnswers
from proxy.route.compaction import CompactionService
from proxy.route.large_requests import LargeRequests
from proxy.route.steps import CompactingRoute
from proxy.route.windows import WindowLearning, configured_windows
from proxy.state.learned_windows import LearnedWindows
from proxy.state.prompt_clock import PromptClock
from proxy.state.sessions import MemorySessions
from proxy.state.store import Store
from proxy.state.store_factory import make_store
from proxy.state.token_factors import ScaledWindows, TokenFactors
from proxy.summaries.answered import AnsweredTenants
from proxy.summaries.prepared_setup import make_prepared
from proxy.summaries.summarizer import OpenAISummarizer
from proxy.telemetry.compaction_cost import CompactionCost, Preparations, preparation_event
from proxy.telemetry.events import EventSink, config_hash
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.session_summary import cache_price_shares
from proxy.telemetry.shadow import ShadowComparer
from proxy.telemetry.tracing import TraceExport, Tracer
from proxy.upstream.pool import Upstream
from proxy.upstream.providers import make_providers
from proxy.upstream.window_probe import WindowProbe


@dataclass
class AppParts:
    """The object graph of one app, built in dependency order."""

    counter: TokenCounter
    policies: dict[str, Policy]
    metrics: Metrics
    upstream: Upstream
    sessions: MemorySessions
    summarizer: OpenAISummarizer | None
    store: Store
    large: LargeRequests
    factors: TokenFactors
    learned: LearnedWindows | None
    service: CompactionService
    shadow: ShadowComparer
    events: EventSink
    route: CompactingRoute
    finishers: list[Finisher]
    observers: list[Observer]
    # Tracing on: the observer that exports each request's spans (flushed at shutdown).
    span_export: TraceExport | None = None
    # Canary mode: the gate's judge, run in the background.
    canary_judge: CanaryJudge | None = None

    @classmethod
    def build(
        cls,
        settings: Settings,
        *,
        log: Any,
        transport: httpx.AsyncBaseTransport | None,
        counter: TokenCounter | None,
        summarizer_transport: httpx.AsyncBaseTransport | None,
        store: Store | None,
    ) -> AppParts:
        counter = counter or make_counter(settings)
        metrics = Metrics()
        upstream = Upstream(settings.upstream, transport=transport)
        # Other processes (workers, or replicas sharing Redis) may serve the same sessions.
        shared = settings.server.workers > 1 or settings.store.backend == "redis"
        sessions = MemorySessions(settings.sessions.max_sessions, shared=shared)
        summarizer = make_summarizer(settings, summarizer_transport)
        store = store or make_store(settings)
        factors = TokenFactors(
            settings.tokens.model_factors,
            calibrate=settings.tokens.calibrate,
            path=Path(settings.state_dir) / "token_factors.json",
        )
        windows = configured_windows(settings, factors, log, metrics)
        learning = make_learning(settings, windows, upstream, metrics, log)
        large = LargeRequests(settings)
        # Whom the upstream answered: a keyless summarizer prepares only for them (answered.py).
        answered = AnsweredTenants()
        preparations = Preparations(log)  # each finished: its own event, the canary book
        service = make_service(
            settings, counter, windows, store, sessions, metrics, summarizer, large, answered, preparations
        )
        policies = build_policies(policy_specs(settings))
        dialects = make_dialects(HiddenRounds(store, shared=shared))
        shadow = ShadowComparer(
            sample_rate=settings.shadow.sample_rate if settings.shadow.compare else 0.0,
            max_concurrent=settings.shadow.max_concurrent,
        )
        loops = LoopRunner(
            dialects=dialects,
            counter=counter,
            windows=windows,
            upstream=upstream,
            store=store,
            metrics=metrics,
            limits=loop_limits(settings),
            read_max_lines=settings.read_tool.max_lines,
        )
        book = make_canary_book(store)
        arms = CanaryArms(settings.canary, book, metrics, log)
        route = make_route(settings, policies, dialects, service, loops, shadow, arms, learning)
        events = EventSink(
            store, settings.events.jsonl_path, log, on_failure=metrics.errors.labels("event").inc
        )
        span_export = make_span_export(settings.tracing, log)
        observers = make_observers(settings, log, metrics, events, shadow, loops, dialects)
        observers += [span_export] if span_export is not None else []
        observers += [canary_record(settings, metrics, book, dialects, log, preparations, events), answered]
        canary = settings.mode == "canary"
        judge = CanaryJudge(settings.canary, book, arms, metrics, events, log) if canary else None
        return cls(
            counter=counter,
            policies=policies,
            metrics=metrics,
            upstream=upstream,
            sessions=sessions,
            summarizer=summarizer,
            store=store,
            large=large,
            factors=factors,
            learned=windows.learned,
            service=service,
            shadow=shadow,
            events=events,
            route=route,
            finishers=[TokenCalibration(factors, dialects), CompactionCost()],
            observers=observers,
            span_export=span_export,
            canary_judge=judge,
        )

    async def settle_preparations(self, session: str) -> None:
        """Wait for ``session``'s preparations in flight in this process (bounded by the
        summarizer's timeout) and for the events written since, theirs among them: what the
        events API does when asked (``x-compaction-prepared: wait``, the replay's header)."""
        prepared = self.service.prepared
        if prepared is not None:
            await prepared.settle_all(session)
        await self.events.drain()

    def edge(self, settings: Settings, log: Any) -> Edge:
        return Edge(
            doors=DOORS,
            route=self.route,
            upstream=self.upstream,
            providers=make_providers(settings),
            metrics=self.metrics,
            finishers=self.finishers,
            observers=self.observers,
            max_body_bytes=settings.server.max_body_bytes,
            logger=log,
            tracer=Tracer(settings.tracing) if self.span_export is not None else None,
        )


def canary_record(
    settings: Settings,
    metrics: Metrics,
    book: CanaryBook,
    dialects: Mapping[str, Dialect],
    log: Any,
    preparations: Preparations,
    events: EventSink,
) -> CanaryRecord:
    """The canary's observer of requests; and each finished preparation recorded at once: its
    own event (the compaction's own cost, ``proxy/telemetry/compaction_cost.py``) and, in
    canary mode, its arm's cost in the book."""
    record = CanaryRecord(metrics, book, CanaryPrices(settings), dialects, log)
    preparations.listeners += [lambda done: events.emit(preparation_event(done)), record.preparation]
    return record


def make_service(
    settings: Settings,
    counter: TokenCounter,
    windows: ScaledWindows,
    store: Store,
    sessions: MemorySessions,
    metrics: Metrics,
    summarizer: OpenAISummarizer | None,
    large: LargeRequests,
    answered: AnsweredTenants | None = None,
    preparations: Preparations | None = None,
) -> CompactionService:
    """The compaction service; prepared summaries shared through the store when other
    processes serve the same sessions."""
    read_schema = tool_schema(settings.read_tool.max_lines)
    return CompactionService(
        counter=counter,
        windows=windows,
        store=store,
        sessions=sessions,
        metrics=metrics,
        summarizer=summarizer,
        large=large,
        record_skipped=settings.events.record_skipped,
        max_sessions=settings.sessions.max_sessions,
        known_prefix_tokens=settings.sessions.known_prefix_tokens,
        injected_tokens=lambda encoding: counter.count_tools([read_schema], encoding),
        prepared=make_prepared(settings, counter, metrics, store if sessions.shared else None, preparations),
        prepare_at=settings.summarizer.prepare_at,
        answered=answered,
        clock=PromptClock(
            settings.prompt_cache,
            settings.sessions.max_sessions,
            shared=store if sessions.shared and settings.store.backend == "redis" else None,
            unshared_peers=sessions.shared and settings.store.backend != "redis",
            model_shares=cache_price_shares(settings.models),
        ),
    )


def make_route(
    settings: Settings,
    policies: Mapping[str, Policy],
    dialects: Mapping[str, Dialect],
    service: CompactionService,
    loops: LoopRunner,
    shadow: ShadowComparer,
    canary: CanaryArms | None = None,
    learning: WindowLearning | None = None,
) -> CompactingRoute:
    return CompactingRoute(
        dialects=dialects,
        policies=policies,
        default_policy=settings.policy,
        default_mode=settings.mode,
        service=service,
        counter=loops.counter,
        windows=loops.windows,
        upstream=loops.upstream,
        metrics=loops.metrics,
        shadow=shadow,
        loops=loops,
        read_max_lines=settings.read_tool.max_lines,
        canary=canary,
        learning=learning,
        compact_answers=CompactAnswers(
            answer=settings.compact.answers(settings.upstream.base_url),
            service=service,
            store=service.store,
            metrics=loops.metrics,
            secret=settings.compact.secret,
        ),
    )


def make_observers(
    settings: Settings,
    log: Any,
    metrics: Metrics,
    events: EventSink,
    shadow: ShadowComparer,
    loops: LoopRunner,
    dialects: Mapping[str, Dialect],
) -> list[Observer]:
    """What reads a request's sealed record once its response is out."""
    version = package_version()
    return [
        CompactionRecord(
            metrics=metrics,
            events=events,
            shadow=shadow,
            ask=loops.ask,
            decide=lambda dialect: dialects[dialect].decision,
            policy_meta={name: (version, config_hash(spec)) for name, spec in policy_specs(settings).items()},
            record_skipped=settings.events.record_skipped,
            log=log,
        ),
        RequestMetrics(metrics),
        AccessLog(log),
    ]


def make_span_export(settings: TracingSettings, log: Any) -> TraceExport | None:
    """The span exporter when tracing is on."""
    return SpanExport(settings, log) if settings.enabled else None


def make_counter(settings: Settings) -> TokenCounter:
    return TokenCounter(
        default_encoding=settings.tokens.default_encoding,
        model_encodings=settings.tokens.model_encodings,
        cache_max_chars=settings.tokens.cache_max_chars,
        backend=settings.tokens.counter,
    )


def make_summarizer(
    settings: Settings, transport: httpx.AsyncBaseTransport | None
) -> OpenAISummarizer | None:
    if settings.summarizer.kind != "openai":
        return None
    return OpenAISummarizer(
        settings.summarizer,
        base_url=settings.upstream.base_url,
        api_key=settings.upstream.api_key,
        transport=transport,
    )


def make_learning(
    settings: Settings, windows: ScaledWindows, upstream: Upstream, metrics: Metrics, log: Any
) -> WindowLearning | None:
    """Windows learned from the provider (upstream.learn_windows), else none."""
    if not settings.upstream.learn_windows or windows.learned is None:
        return None
    return WindowLearning(
        windows, windows.learned, WindowProbe(upstream, version=package_version()), metrics, log
    )


def loop_limits(settings: Settings) -> LoopLimits:
    reads = settings.read_tool
    return LoopLimits(
        max_rounds=reads.max_rounds,
        max_calls_per_answer=reads.max_calls_per_answer,
        max_total_bytes=reads.max_total_bytes,
        read=ReadLimits(
            max_lines=reads.max_lines,
            max_line_chars=reads.max_line_chars,
            max_result_bytes=reads.max_result_bytes,
            max_result_tokens=reads.max_result_tokens,
        ),
        timeout_seconds=reads.timeout_seconds,
        max_response_bytes=settings.upstream.max_response_bytes,
        max_event_bytes=settings.upstream.max_event_bytes,
    )


_CONTROL_PREFIXES = ("/v1/compaction/",)
