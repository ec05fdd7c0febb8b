"""The ``/v1`` edge: every request that no admin route claimed, dispatched to a compacting
route (a dialect the proxy compacts) or relayed verbatim.

This is a raw ASGI handler on purpose. A proxy must relay bytes and stream chunks as they
arrive, see a client disconnect, and never re-encode what it does not change; a framework
request/response cycle would get in the way of all four and cost time on every request.
Here: the request id, the credential rule, the path check, the body (bounded), the
disconnect watch, the dispatch, the error answer, and the observers once the response is out.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import structlog

from proxy.dialects import BODY_SAYS, Door, DoorTable, Target
from proxy.edge.host_guard import cross_site_refusal
from proxy.observe.observers import Finisher, Observer
from proxy.route.steps import CompactingRoute
from proxy.state.sessions import credentials
from proxy.telemetry.exchange import ClientDisconnected, Exchange, new_request_id
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.tracing import Tracer
from proxy.upstream.pool import Upstream
from proxy.upstream.providers import Provider, Providers
from proxy.upstream.relay import relay
from proxy.wire.errors import ProxyError
from proxy.wire.forwarding import UnsafePath, header_value, key_from_query
from proxy.wire.response_writer import ResponseWriter

Scope = Mapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class Edge:
    def __init__(
        self,
        *,
        doors: Sequence[Door],
        route: CompactingRoute,
        upstream: Upstream,
        providers: Providers,
        metrics: Metrics,
        finishers: Sequence[Finisher],
        observers: Sequence[Observer],
        max_body_bytes: int,
        logger: Any = None,
        tracer: Tracer | None = None,
    ) -> None:
        """``doors``: the routes whose requests are compacted (``proxy/dialects``)."""
        self.doors = DoorTable(doors)
        self.route = route
        self.upstream = upstream
        self.providers = providers
        self.metrics = metrics
        self.finishers = finishers
        self.observers = observers
        self.max_body = max_body_bytes
        self.tracer = tracer  # None: tracing off, no trace is made
        # Bound once: a lazy proxy logger would resolve its configuration on every call.
        self.log = (logger or structlog.get_logger("compaction_proxy")).bind()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
        raw_path = raw_path.split(b"?", 1)[0]
        found = self.doors.find(scope["method"].encode("latin-1"), raw_path, scope.get("query_string", b""))
        door, target = found if found is not None else (None, BODY_SAYS)
        exchange = Exchange(
            request_id=new_request_id(),
            route=door.dialect if door else "passthrough",
            method=scope["method"],
            started=time.perf_counter(),
        )
        exchange.extra_headers.append((b"x-compaction-request-id", exchange.request_id.encode()))
        if self.tracer is not None:
            exchange.trace = self.tracer.begin(scope["headers"])
        provider = (
            self.providers.by_name(door.provider)
            if door
            else self.providers.for_request(raw_path, scope["headers"])
        )
        watcher: list[asyncio.Task[None]] = []
        try:
            request = _Request(scope, raw_path, provider, door, target)
            await self._serve(request, receive, send, exchange, watcher)
        except ProxyError as error:
            exchange.status = error.status
            exchange.error = exchange.error or (error.code or error.type)
            self.metrics.errors.labels(exchange.error).inc()
            exchange.responded = True
            with contextlib.suppress(OSError):
                await ResponseWriter(
                    send, extra_headers=exchange.extra_headers, error_body=provider.error_body
                ).fail(error)
        except ClientDisconnected:
            exchange.error = "client_disconnected"
        except asyncio.CancelledError:
            if exchange.error != "client_disconnected":
                raise
            # Cancelled by our own disconnect watcher: the client is gone, nothing to answer.
        finally:
            exchange.responded = True
            for task in watcher:
                task.cancel()
            self._observe(exchange)

    async def _serve(
        self,
        request: _Request,
        receive: Receive,
        send: Send,
        exchange: Exchange,
        watcher: list[asyncio.Task[None]],
    ) -> None:
        """The credential rule, the cross-site rule, the path check, the body, then the door's
        route or a relay; ``watcher`` gets the task that watches for the client's disconnect."""
        scope, provider, door = request.scope, request.provider, request.door
        anonymous = not credentials(request.headers)
        if provider.refuse_anonymous and anonymous:
            raise ProxyError(
                401,
                "You didn't provide an API key. Send it in an Authorization header "
                "(Authorization: Bearer YOUR_KEY), or an api-key, x-api-key or x-goog-api-key header.",
                code="missing_api_key",
            )
        if anonymous:
            # Let in without a credential (one needs a preflight no page passes), so a browser
            # page of any site could spend the upstream and write the shared tenant's state:
            # refuse what a page sends unasked.
            refusal = cross_site_refusal(scope["method"], request.headers)
            if refusal is not None:
                raise refusal
        try:
            url = provider.url(request.raw_path, request.query)
        except UnsafePath:
            raise ProxyError(400, "The request path is not allowed.", code="invalid_path") from None
        body = await self._read_body(scope, receive)
        watcher.append(asyncio.create_task(_watch_disconnect(receive, exchange, asyncio.current_task())))
        if door is not None:
            draft = self.route.draft(
                door.dialect, request.headers, body, url, exchange, provider, request.target
            )
            del body  # the draft owns the bytes, and drops them once they are sent
            await self.route.handle(send, draft)
            return
        await relay(
            upstream=self.upstream,
            metrics=self.metrics,
            send=send,
            method=scope["method"],
            url=url,
            headers=provider.upstream_headers(request.headers),
            content=body,
            exchange=exchange,
            route_headers=None,
            error_body=provider.error_body,
        )

    def _observe(self, exchange: Exchange) -> None:
        for finisher in self.finishers:
            self._safely(finisher, finisher.finish, exchange)
        exchange.seal()
        for observer in self.observers:
            self._safely(observer, observer.observe, exchange)

    def _safely(self, step: object, call: Callable[[Exchange], None], exchange: Exchange) -> None:
        try:
            call(exchange)
        except Exception as exc:  # recording must never fail a request that was answered
            self.metrics.errors.labels("event").inc()
            self.log.warning("observer_failed", observer=type(step).__name__, error=type(exc).__name__)

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        declared = header_value(scope["headers"], b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            raise ProxyError(
                413,
                f"The request body exceeds the proxy's limit of {self.max_body} bytes.",
                code="request_too_large",
            )
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnected
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > self.max_body:
                    raise ProxyError(
                        413,
                        f"The request body exceeds the proxy's limit of {self.max_body} bytes.",
                        code="request_too_large",
                    )
                chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class _Request:
    """What the edge read of a request before its body: its headers and query with a key sent in
    the query moved into the provider's header (a URL never carries it on), its door and what
    its path says (``Target``)."""

    __slots__ = ("door", "headers", "provider", "query", "raw_path", "scope", "target")

    def __init__(
        self, scope: Scope, raw_path: bytes, provider: Provider, door: Door | None, target: Target
    ) -> None:
        self.scope, self.raw_path, self.provider = scope, raw_path, provider
        self.door, self.target = door, target
        self.headers: list[tuple[bytes, bytes]] = scope["headers"]
        self.query: bytes = scope.get("query_string", b"")
        if provider.query_key is not None:
            self.query, key = key_from_query(self.query, provider.query_key)
            if key is not None and header_value(self.headers, provider.key_header) is None:
                self.headers = [*self.headers, (provider.key_header, key)]


async def _watch_disconnect(receive: Receive, exchange: Exchange, current: asyncio.Task[Any] | None) -> None:
    """After the body is read, the next ASGI message is the disconnect; cancelling the relay
    closes the upstream connection, so the upstream stops generating too."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if not exchange.responded and current is not None:
                exchange.error = "client_disconnected"
                current.cancel()
            return
