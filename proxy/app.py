"""The application factory. Everything an app needs is built here and owned by it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import httpx
import structlog
from litestar import Litestar
from litestar.exceptions import NotFoundException

from policies.pipeline import Policy
from policies.tokens import TokenCounter
from proxy import package_version
from proxy.config.settings import Settings
from proxy.dialects import DOORS
from proxy.edge.api_docs import openapi_config
from proxy.edge.control import control_routes, not_found
from proxy.edge.host_guard import HostGuard, refuse_misdirected
from proxy.edge.session_path import with_path_session
from proxy.edge.v1 import Edge, Receive, Scope, Send
from proxy.lifecycle import Lifecycle
from proxy.parts import AppParts
from proxy.state.sessions import MemorySessions
from proxy.state.store import Store
from proxy.telemetry.metrics import Metrics
from proxy.upstream.pool import Upstream
from proxy.upstream.providers import DATA_PLANE_PREFIXES


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
    log = (logger or structlog.get_logger("compaction_proxy")).bind()
    parts = AppParts.build(
        settings,
        log=log,
        transport=transport,
        counter=counter,
        summarizer_transport=summarizer_transport,
        store=store,
    )
    state = AppState(
        settings=settings,
        upstream=parts.upstream,
        counter=parts.counter,
        policies=parts.policies,
        metrics=parts.metrics,
        sessions=parts.sessions,
    )
    lifecycle = Lifecycle(settings, parts, state.ready, log)
    app = Litestar(
        route_handlers=control_routes(
            settings,
            parts.store,
            parts.metrics,
            state.ready,
            version=package_version(),
            learned=parts.learned.told if parts.learned is not None else None,
            settle=parts.settle_preparations,
        ),
        on_startup=[lifecycle.startup],
        on_shutdown=[lifecycle.shutdown],
        openapi_config=openapi_config(package_version(), DOORS),
        exception_handlers={NotFoundException: not_found},
        logging_config=None,
        debug=False,
    )
    app.state.proxy = state
    guard = HostGuard(settings.server.allowed_hosts, settings.server.host)
    return ProxyApp(app, parts.edge(settings, log), state, guard)


class ProxyApp:
    """The ASGI entry point: ``/v1/*`` (and Google's paths) go straight to the proxy handler, the rest
    (health, metrics, admin, OpenAPI, lifespan) to the Litestar app.

    The data plane skips the framework's router and middleware on purpose: they would
    wrap every streamed chunk and cost time on every request for features a byte relay
    does not use.
    """

    def __init__(self, control: Litestar, edge: Edge, state: AppState, guard: HostGuard) -> None:
        self.control = control
        self.edge = edge
        self.state = state
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            # A Host this proxy does not answer for (DNS rebinding): 421 before anything is read.
            if not self.guard.allows(scope["headers"]):
                self.edge.metrics.errors.labels("misdirected_request").inc()
                await refuse_misdirected(send)
                return
            scope = with_path_session(scope)  # /s/<session>/... is the header X-Session-Id
        if scope["type"] == "http" and is_data_plane(scope["path"]):
            await self.edge(scope, receive, send)
        else:
            await self.control(scope, receive, send)  # type: ignore[arg-type]


_CONTROL_PREFIXES = ("/v1/compaction/",)


def is_data_plane(path: str) -> bool:
    """Every ``/v1`` path is forwarded upstream except the proxy's own admin API, and so are
    Google's (``/v1beta/``, ``/v1alpha/``, ``/v1internal:``)."""
    if path.startswith(DATA_PLANE_PREFIXES):
        return True
    return (path == "/v1" or path.startswith("/v1/")) and not path.startswith(_CONTROL_PREFIXES)
