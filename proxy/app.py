"""The application factory. Everything an app needs is built here and owned by it."""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import structlog
from litestar import Litestar
from litestar.exceptions import NotFoundException

from policies.pipeline import Policy, build_policies
from policies.tokens import TokenCounter
from proxy.api_docs import openapi_config
from proxy.compaction import CompactionService
from proxy.control import control_routes, not_found
from proxy.dialects import DOORS, make_dialects
from proxy.edge import Edge, Receive, Scope, Send
from proxy.events import EventSink, config_hash
from proxy.hidden_rounds import HiddenRounds
from proxy.large_requests import LargeRequests
from proxy.loop_runner import LoopRunner
from proxy.memory import malloc_trim, trim_forever
from proxy.metrics import Metrics
from proxy.observers import AccessLog, CompactionRecord, Observer, RequestMetrics, TokenCalibration
from proxy.providers import make_providers
from proxy.read_loop import LoopLimits
from proxy.read_tool import ReadLimits, tool_schema
from proxy.route import CompactingRoute
from proxy.sessions import MemorySessions
from proxy.settings import Settings, policy_specs
from proxy.shadow import ShadowComparer
from proxy.store import Store
from proxy.store_factory import describe_store, make_store
from proxy.summarizer import OpenAISummarizer
from proxy.token_factors import ScaledWindows, TokenFactors
from proxy.upstream import Upstream


@dataclass
class AppState:
    """What one running app owns; reachable as ``app.state.proxy`` for tests and tools."""

    settings: Settings
    upstream: Upstream
    counter: TokenCounter
    policies: dict[str, Policy]
    metrics: Metrics
    sessions: MemorySessions
    ready: asyncio.Event = field(default_factory=asyncio.Event)


def prepare_state_dir(path: str) -> Path:
    """Create the state directory readable by its owner only (it will hold offloaded
    tool outputs, which can contain anything a tool printed)."""
    state = Path(path)
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(state, 0o700)
    return state


def create_app(
    settings: Settings,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    logger: Any = None,
    counter: TokenCounter | None = None,
    summarizer_transport: httpx.AsyncBaseTransport | None = None,
    store: Store | None = None,
) -> ProxyApp:
    """Build the proxy: the only place that builds its object graph. ``transport`` replaces
    the upstream network (tests use ``httpx.MockTransport`` or respx); ``counter`` lets callers
    share a warm counter."""
    counter = counter or TokenCounter(
        default_encoding=settings.tokens.default_encoding,
        model_encodings=settings.tokens.model_encodings,
        cache_max_chars=settings.tokens.cache_max_chars,
    )
    policies = build_policies(policy_specs(settings))
    metrics = Metrics()
    upstream = Upstream(settings.upstream, transport=transport)
    # Other processes (workers, or replicas sharing Redis) may serve the same sessions.
    shared = settings.server.workers > 1 or settings.store.backend == "redis"
    sessions = MemorySessions(settings.sessions.max_sessions, shared=shared)
    summarizer = (
        OpenAISummarizer(
            settings.summarizer,
            base_url=settings.upstream.base_url,
            api_key=settings.upstream.api_key,
            transport=summarizer_transport,
        )
        if settings.summarizer.kind == "openai"
        else None
    )
    store = store or make_store(settings)
    log = (logger or structlog.get_logger("compaction_proxy")).bind()
    state = AppState(
        settings=settings,
        upstream=upstream,
        counter=counter,
        policies=policies,
        metrics=metrics,
        sessions=sessions,
    )
    read_schema = tool_schema(settings.read_tool.max_lines)
    large = LargeRequests(settings)
    factors = TokenFactors(
        settings.tokens.model_factors,
        calibrate=settings.tokens.calibrate,
        path=Path(settings.state_dir) / "token_factors.json",
    )
    windows = ScaledWindows(
        settings.context_windows,
        factors,
        on_default=lambda model, window: log.warning(
            "model_window_defaulted", model=model[:200], window=window, fix="add the model to `models:`"
        ),
    )
    service = CompactionService(
        counter=counter,
        windows=windows,
        store=store,
        sessions=sessions,
        metrics=metrics,
        summarizer=summarizer,
        large=large,
        record_skipped=settings.events.record_skipped,
        max_sessions=settings.sessions.max_sessions,
        injected_tokens=lambda encoding: counter.count_tools([read_schema], encoding),
    )
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
    route = CompactingRoute(
        dialects=dialects,
        policies=policies,
        default_policy=settings.policy,
        default_mode=settings.mode,
        service=service,
        counter=counter,
        windows=windows,
        upstream=upstream,
        metrics=metrics,
        shadow=shadow,
        loops=loops,
        read_max_lines=settings.read_tool.max_lines,
    )
    events = EventSink(store, settings.events.jsonl_path, log, on_failure=metrics.errors.labels("event").inc)
    version = package_version()
    observers: list[Observer] = [
        TokenCalibration(factors, dialects),
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
    edge = Edge(
        doors=DOORS,
        route=route,
        upstream=upstream,
        providers=make_providers(settings),
        metrics=metrics,
        observers=observers,
        max_body_bytes=settings.server.max_body_bytes,
        logger=log,
    )
    background: set[asyncio.Task[None]] = set()

    async def expire_forever() -> None:
        keep = settings.store.keep_days * 86_400
        while True:
            await asyncio.sleep(settings.store.expiry_interval_seconds)
            try:
                cleared = await store.expire(keep)
                log.info("store_expiry", outputs_expired=cleared)
            except Exception as exc:  # expiry retries at the next interval
                log.warning("store_expiry_failed", error=type(exc).__name__)

    async def save_factors_forever() -> None:
        while True:
            await asyncio.sleep(30)
            await asyncio.to_thread(factors.save)

    state_dir = os.path.abspath(settings.state_dir)  # for the start line

    async def on_startup() -> None:
        prepare_state_dir(settings.state_dir)
        await asyncio.to_thread(factors.load)
        background.add(asyncio.create_task(save_factors_forever()))
        # Loading a BPE table takes a few hundred ms: do it off the event loop, before ready.
        await asyncio.to_thread(counter.warm_up)
        try:
            await store.expire(settings.store.keep_days * 86_400)  # also opens the store
        except Exception as exc:
            # A store that cannot even be read stops the start; one that cannot be written
            # (a full disk) starts: every write path fails open, reads keep working.
            await store.events(None, limit=1)
            log.warning("store_expiry_failed", error=type(exc).__name__)
        background.add(asyncio.create_task(expire_forever()))
        trim = malloc_trim() if settings.server.malloc_trim_seconds > 0 else None
        if trim is not None:
            background.add(asyncio.create_task(trim_forever(trim, settings.server.malloc_trim_seconds)))
        state.ready.set()
        log.info(
            "started",
            version=package_version(),
            listen=f"http://{settings.server.host}:{settings.server.port}",
            upstream=settings.upstream.base_url,
            anthropic=settings.anthropic.base_url,
            policy=settings.policy,
            mode=settings.mode,
            store=describe_store(settings),
            state_dir=state_dir,
            policies=sorted(policies),
        )

    async def on_shutdown() -> None:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, *service.background, return_exceptions=True)
        await asyncio.gather(*shadow.tasks, return_exceptions=True)
        await events.drain()
        await asyncio.to_thread(factors.save)
        large.close()
        await store.close()
        await upstream.aclose()
        if summarizer is not None:
            await summarizer.aclose()

    app = Litestar(
        route_handlers=control_routes(settings, store, metrics, state.ready),
        on_startup=[on_startup],
        on_shutdown=[on_shutdown],
        openapi_config=openapi_config(version, DOORS),
        exception_handlers={NotFoundException: not_found},
        logging_config=None,
        debug=False,
    )
    app.state.proxy = state
    return ProxyApp(app, edge, state)


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


def package_version() -> str:
    try:
        return importlib.metadata.version("compaction-proxy")
    except importlib.metadata.PackageNotFoundError:
        return "0"


class ProxyApp:
    """The ASGI entry point: ``/v1/*`` goes straight to the proxy handler, the rest
    (health, metrics, admin, OpenAPI, lifespan) to the Litestar app.

    The data plane skips the framework's router and middleware on purpose: they would
    wrap every streamed chunk and cost time on every request for features a byte relay
    does not use.
    """

    def __init__(self, control: Litestar, edge: Edge, state: AppState) -> None:
        self.control = control
        self.edge = edge
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and is_data_plane(scope["path"]):
            await self.edge(scope, receive, send)
        else:
            await self.control(scope, receive, send)  # type: ignore[arg-type]


_CONTROL_PREFIXES = ("/v1/compaction/",)


def is_data_plane(path: str) -> bool:
    """Every ``/v1`` path is forwarded upstream except the proxy's own admin API."""
    return (path == "/v1" or path.startswith("/v1/")) and not path.startswith(_CONTROL_PREFIXES)
