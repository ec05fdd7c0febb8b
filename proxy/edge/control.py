"""The control plane: health, readiness, metrics, the compaction events API and the session
page (Litestar).

Everything under ``/v1`` but ``/v1/compaction/`` is the data plane (``proxy/edge/v1.py``).
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

import orjson
from litestar import MediaType, Request, Response, get, head
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromQuery

from policies.windows import ContextWindows
from proxy.config.settings import Settings, settings_digest
from proxy.state.sessions import credentials, explicit_session, tenant_of
from proxy.state.sqlite_control import ControlPlaneBusy
from proxy.state.store import Store
from proxy.telemetry.metrics import CONTENT_TYPE, Metrics
from proxy.telemetry.session_summary import PriceColumn, SummarizerPrices, priced
from proxy.wire.errors import ProxyError, anthropic_error_body, error_body, openai_error_body

SERVICE = "compaction-proxy"


def identity(settings: Settings, version: str) -> dict[str, Any]:
    """What this proxy is and which configuration it runs, for a client (``wrap``) deciding
    whether to send an agent's key here: no secret, only the digest of the resolved settings
    (``settings_digest``), the default policy and mode, and the context windows the policies
    hold each model to (so a summary can name a model's window)."""
    return {
        "service": SERVICE,
        "version": version,
        "config_digest": settings_digest(settings),
        "policy": settings.policy,
        "mode": settings.mode,
        "context_windows": dict(settings.context_windows),
    }


def control_routes(
    settings: Settings,
    store: Store,
    metrics: Metrics,
    ready: asyncio.Event,
    *,
    version: str = "0",
    learned: Callable[[], dict[str, int]] | None = None,
    settle: Callable[[str], Awaitable[None]] | None = None,
) -> list[HTTPRouteHandler]:
    me = identity(settings, version)

    @get("/", sync_to_thread=False, media_type=MediaType.JSON)
    def root() -> dict[str, str]:
        """What answers here (clients such as Claude Code probe the base URL at start)."""
        return {"service": SERVICE, "status": "ok"}

    @head("/", sync_to_thread=False, include_in_schema=False)
    def root_head() -> None:
        """The probe as ``HEAD /``."""

    @get("/healthz", sync_to_thread=False, media_type=MediaType.JSON)
    def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @get("/readyz", sync_to_thread=False, media_type=MediaType.JSON)
    def readyz() -> Response[dict[str, Any]]:
        """Readiness: encodings loaded and the state directory usable; with the proxy's
        identity (``service``, ``version``, ``config_digest``, ``policy``, ``mode``,
        ``context_windows``), which holds no secret, and the windows its upstreams told it
        (``learned_windows``: model to tokens)."""
        told = {"learned_windows": learned() if learned is not None else {}}
        if ready.is_set():
            return Response({"status": "ready", **me, **told})
        return Response({"status": "starting", **me, **told}, status_code=503)

    @get("/metrics", sync_to_thread=False)
    def metrics_route() -> Response[bytes]:
        """Prometheus text exposition."""
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    return [root, root_head, healthz, readyz, metrics_route, *event_routes(settings, store, learned, settle)]


def event_routes(
    settings: Settings,
    store: Store,
    learned: Callable[[], dict[str, int]] | None = None,
    settle: Callable[[str], Awaitable[None]] | None = None,
) -> list[HTTPRouteHandler]:
    """The compaction events API, the sessions list and the session page (tenant-scoped);
    ``settle(session)``: wait for the session's preparations in flight and their events."""
    prices = PriceColumn(settings.models)
    own_prices = SummarizerPrices.of(settings.models, settings.summarizer.model)
    table = ContextWindows(settings.context_windows)
    page = (resources.files("proxy.edge") / "session_page.html").read_bytes()

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
        ``session`` is the client's X-Session-Id or the proxy's session id (``s_...``); with
        ``x-compaction-prepared: wait``, its preparations in flight here and their events are
        waited for first (bounded by the summarizer's timeout: a replay's read)."""
        scope = scope_of(settings, request, tenant)
        if isinstance(scope, Response):
            return scope
        if session and not session.startswith("s_"):
            if scope is None:
                return _refused(400, "Pass the tenant with an X-Session-Id.", "invalid_request_error")
            session = explicit_session(scope, session)
        if session and settle is not None and _header(request, b"x-compaction-prepared") == b"wait":
            await settle(session)
        try:
            found = await store.events(
                scope, session=session, policy=policy, since=since, limit=max(1, min(limit, 1000))
            )
        except ControlPlaneBusy:
            return _busy()
        return Response({"object": "list", "data": found})

    @get("/v1/compaction/sessions", media_type=MediaType.JSON)
    async def compaction_sessions(
        request: Request[Any, Any, Any],
        limit: FromQuery[int] = 50,
        tenant: FromQuery[str | None] = None,
    ) -> Response[Any]:
        """The caller's recent sessions, newest first, as the store keeps them summed from their
        events (one row read a session, never the events themselves): model, door, requests,
        tokens sent and sent upstream, compaction points, reads, the compaction's own tokens (the
        summarizer's, apart from the prompt) and cost (at the summarizer model's prices), the
        estimated savings net of that cost (the prompt tokens saved at the ``models`` table's
        ``input_price``, less the compaction's own cost), the canary arm, and the window the
        proxy now holds the model to (``window_from``: ``provider`` when its upstream told it,
        else ``table``)."""
        scope = scope_of(settings, request, tenant)
        if isinstance(scope, Response):
            return scope
        try:
            rows = priced(await store.sessions(scope, limit=max(1, min(limit, 500))), prices, own_prices)
        except ControlPlaneBusy:
            return _busy()
        told = learned() if learned is not None else {}
        for row in rows:
            # The window its policy held the session to: the provider's word where it gave one.
            model = row.get("model")
            if isinstance(model, str):
                row["window"] = told.get(model) or table.window_for(model)
                row["window_from"] = "provider" if model in told else "table"
        return Response({"object": "list", "data": rows})

    @get("/ui", sync_to_thread=False, media_type=MediaType.HTML, include_in_schema=False)
    def session_page() -> Response[bytes]:
        """The session page: self-contained (no request leaves for another host)."""
        return Response(page, media_type=MediaType.HTML, headers=_PAGE_HEADERS)

    return [compaction_events, compaction_sessions, session_page]


def _header(request: Request[Any, Any, Any], name: bytes) -> bytes | None:
    return next((v for k, v in request.scope["headers"] if k.lower() == name), None)


def scope_of(
    settings: Settings, request: Request[Any, Any, Any], tenant: str | None
) -> str | Response[Any] | None:
    """The tenant a caller of the events API sees, or the refusal. With an admin token
    configured it is required and sees every tenant (``tenant`` filters); without one, a
    caller sees its own tenant only."""
    raw_headers = [(k.lower(), v) for k, v in request.scope["headers"]]
    if settings.server.admin_token:
        if not admin_token_matches(raw_headers, settings.server.admin_token):
            return _refused(401, "The admin token is required.", "authentication_error")
        return tenant
    if (
        not credentials(raw_headers)
        and (settings.upstream.api_key or settings.anthropic.api_key)
        and not settings.server.allow_anonymous
    ):
        # Anonymous clients are refused on the data plane: they own no events either.
        return _refused(401, "An API key is required.", "authentication_error")
    return tenant_of(raw_headers)


def admin_token_matches(headers: list[tuple[bytes, bytes]], token: str) -> bool:
    """The request's ``Authorization`` is ``Bearer <token>``, compared in constant time as bytes:
    ``compare_digest`` on text raises for anything not ASCII, so a header or a token with other
    characters would be a 500 where it must be a 401. The token is taken as UTF-8, the header as
    the bytes sent (one header only: two are a refusal)."""
    sent = [value for name, value in headers if name == b"authorization"]
    wanted = b"Bearer " + token.encode("utf-8", "surrogateescape")
    return len(sent) == 1 and hmac.compare_digest(sent[0], wanted)


# The page may load nothing from anywhere but this proxy; its script and style are inline.
_PAGE_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


def _busy() -> Response[Any]:
    """Too many control-plane reads wait: refused at once, never queued on the data plane."""
    refused = _refused(503, "Too many control-plane reads are waiting; retry shortly.", "overloaded_error")
    refused.headers["retry-after"] = "1"
    return refused


def _refused(status: int, message: str, kind: str) -> Response[Any]:
    return Response(orjson.loads(error_body(message, type=kind)), status_code=status)


# Where each API lives on the proxy, for the hint of a path it does not serve.
_DOORS = ("/chat/completions", "/responses", "/messages", "/models", "/embeddings", "/completions")


def not_found(request: Request[Any, Any, Any], _exc: Exception) -> Response[bytes]:
    """A path the proxy does not serve, answered in the shape of the API the client speaks
    (Anthropic's for ``/messages`` or a request with ``anthropic-version``, else OpenAI's),
    saying where the API is: a client whose base URL lacks ``/v1`` (``@ai-sdk/anthropic`` given
    ``http://host:port``) is told the URL to use."""
    path = request.url.path
    hint = "The proxy's APIs are under /v1 (POST /v1/chat/completions, /v1/responses, /v1/messages)."
    if path.endswith(_DOORS) and not path.startswith("/v1/"):
        hint = f"Did you mean /v1{path}? Set the client's base URL to end in /v1."
    error = ProxyError(404, f"No route {request.method} {path} on this proxy. {hint}", code="not_found")
    anthropic = path.endswith("/messages") or "anthropic-version" in request.headers
    body = anthropic_error_body(error) if anthropic else openai_error_body(error)
    return Response(body, status_code=404, media_type=MediaType.JSON)
