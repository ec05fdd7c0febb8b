"""The application factory. Everything an app needs is built here and owned by it."""

from __future__ import annotations

import asyncio
import hmac
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import structlog
from litestar import Litestar, MediaType, Request, Response, get
from litestar.openapi import OpenAPIConfig
from litestar.params import FromQuery

from policies.pipeline import Policy, build_policies
from policies.tokens import TokenCounter
from proxy.errors import error_body
from proxy.handlers import ProxyHandler, Receive, Scope, Send
from proxy.memory import malloc_trim, trim_forever
from proxy.metrics import CONTENT_TYPE, Metrics
from proxy.sessions import MemorySessions, credentials, explicit_session, tenant_of
from proxy.settings import Settings, load_settings, policy_specs
from proxy.store import SQLiteStore, Store
from proxy.summarizer import OpenAISummarizer
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
    """Build the proxy. ``transport`` replaces the upstream network (tests use
    ``httpx.MockTransport`` or respx); ``counter`` lets callers share a warm counter."""
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
    state = AppState(
        settings=settings,
        upstream=upstream,
        counter=counter,
        policies=policies,
        metrics=metrics,
        sessions=sessions,
    )
    store = store or make_store(settings)
    handler = ProxyHandler(
        settings,
        upstream,
        counter,
        policies,
        metrics,
        logger=logger,
        sessions=sessions,
        summarizer=summarizer,
        store=store,
    )
    log = logger or structlog.get_logger("compaction_proxy")
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

    @get("/healthz", sync_to_thread=False, media_type=MediaType.JSON)
    def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @get("/readyz", sync_to_thread=False, media_type=MediaType.JSON)
    def readyz() -> Response[dict[str, str]]:
        """Readiness: encodings loaded and the state directory usable."""
        if state.ready.is_set():
            return Response({"status": "ready"})
        return Response({"status": "starting"}, status_code=503)

    @get("/v1/compaction/events", media_type=MediaType.JSON)
    async def compaction_events(
        request: Request[Any, Any, Any],
        session: FromQuery[str | None] = None,
        policy: FromQuery[str | None] = None,
        since: FromQuery[float] = 0.0,
        limit: FromQuery[int] = 100,
        tenant: FromQuery[str | None] = None,
    ) -> Response[Any]:
        """Compaction events, oldest first. With an admin token configured it is required and
        sees every tenant (``tenant`` filters); without one, a caller sees its own tenant only.
        ``session`` is the client's X-Session-Id or the proxy's session id (``s_...``)."""
        raw_headers = [(k.lower(), v) for k, v in request.scope["headers"]]
        if settings.server.admin_token:
            if not hmac.compare_digest(
                request.headers.get("authorization", ""), f"Bearer {settings.server.admin_token}"
            ):
                return Response(
                    orjson.loads(error_body("The admin token is required.", type="authentication_error")),
                    status_code=401,
                )
            scope = tenant
        else:
            if (
                not credentials(raw_headers)
                and settings.upstream.api_key
                and not settings.server.allow_anonymous
            ):
                # Anonymous clients are refused on the data plane: they own no events either.
                return Response(
                    orjson.loads(error_body("An API key is required.", type="authentication_error")),
                    status_code=401,
                )
            scope = tenant_of(raw_headers)
        if session and not session.startswith("s_"):
            if scope is None:
                return Response(
                    orjson.loads(
                        error_body("Pass the tenant with an X-Session-Id.", type="invalid_request_error")
                    ),
                    status_code=400,
                )
            session = explicit_session(scope, session)
        found = await store.events(
            scope, session=session, policy=policy, since=since, limit=max(1, min(limit, 1000))
        )
        return Response({"object": "list", "data": found})

    @get("/metrics", sync_to_thread=False)
    def metrics_route() -> Response[bytes]:
        """Prometheus text exposition."""
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    async def on_startup() -> None:
        prepare_state_dir(settings.state_dir)
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
            upstream=settings.upstream.base_url,
            policy=settings.policy,
            mode=settings.mode,
            policies=sorted(policies),
        )

    async def on_shutdown() -> None:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, *handler.background, return_exceptions=True)
        await asyncio.gather(*handler.shadow.tasks, return_exceptions=True)
        await handler.events.drain()
        handler.large.close()
        await store.close()
        await upstream.aclose()
        if summarizer is not None:
            await summarizer.aclose()

    app = Litestar(
        route_handlers=[healthz, readyz, metrics_route, compaction_events],
        on_startup=[on_startup],
        on_shutdown=[on_shutdown],
        openapi_config=OpenAPIConfig(title="compaction-proxy", version="0.1.0", path="/schema"),
        logging_config=None,
        debug=False,
    )
    app.state.proxy = state
    return ProxyApp(app, handler, state)


def make_store(settings: Settings) -> Store:
    if settings.store.backend == "redis":
        from proxy.store_redis import RedisStore

        return RedisStore(settings.store.redis_url, settings.store.keep_days * 86_400)
    return SQLiteStore(settings.store.path or Path(settings.state_dir) / "compaction.db")


def app_from_environment() -> ProxyApp:
    """The app of one worker process when ``server.workers`` > 1 (uvicorn's factory)."""
    from proxy.logs import configure_logging

    overrides = orjson.loads(os.environ.get("COMPACTION_PROXY_OVERRIDES", "{}"))
    settings = load_settings(overrides=overrides)
    configure_logging(settings.logging.level, settings.logging.format)
    from proxy.cli import http_protocol

    http_protocol(settings)  # this worker's connection limits
    return create_app(settings)


class ProxyApp:
    """The ASGI entry point: ``/v1/*`` goes straight to the proxy handler, the rest
    (health, metrics, admin, OpenAPI, lifespan) to the Litestar app.

    The data plane skips the framework's router and middleware on purpose: they would
    wrap every streamed chunk and cost time on every request for features a byte relay
    does not use.
    """

    def __init__(self, control: Litestar, handler: ProxyHandler, state: AppState) -> None:
        self.control = control
        self.handler = handler
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and is_data_plane(scope["path"]):
            await self.handler(scope, receive, send)
        else:
            await self.control(scope, receive, send)  # type: ignore[arg-type]


_CONTROL_PREFIXES = ("/v1/compaction/",)


def is_data_plane(path: str) -> bool:
    """Every ``/v1`` path is forwarded upstream except the proxy's own admin API."""
    return (path == "/v1" or path.startswith("/v1/")) and not path.startswith(_CONTROL_PREFIXES)
