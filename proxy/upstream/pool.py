"""The pooled upstream connection and the mapping of transport failures to client errors."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import structlog

from proxy.config.sections import UpstreamSettings
from proxy.upstream.aiohttp_transport import AiohttpTransport
from proxy.upstream.builtin_transport import BuiltinTransport
from proxy.upstream.failures import Failure, classify, describe
from proxy.upstream.parts_transport import PartsTransport
from proxy.wire.errors import ProxyError

# Failures are rare: a lazy logger (it follows the configuration, and tests' capture) is enough.
_log = structlog.get_logger("compaction_proxy")


class Upstream:
    """One keep-alive pool for the life of the app, used at the transport level.

    A proxy must not behave like a user agent: ``httpx.AsyncClient`` would keep a cookie
    jar shared by every client of the proxy, follow redirects, apply auth and add its own
    default headers. Requests go straight to a transport instead (``httpx.MockTransport``
    or respx stand in for it in tests), which also skips that per-request work.
    """

    def __init__(self, settings: UpstreamSettings, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.transport = transport or make_transport(settings)
        self.timeout: dict[str, Any] = httpx.Timeout(
            settings.timeout, connect=settings.connect_timeout
        ).as_dict()

    async def open(
        self, method: str, url: str, headers: list[tuple[bytes, bytes]], content: bytes
    ) -> httpx.Response:
        """Send a request; the response body is left unread for the caller to stream."""
        if isinstance(self.transport, PartsTransport):
            return await self.transport.send(method, url, headers, content, self.timeout)
        request = httpx.Request(
            method, url, headers=headers, content=content, extensions={"timeout": self.timeout}
        )
        try:
            response = await self.transport.handle_async_request(request)
        except httpx.HTTPError as exc:
            _attach(exc, request)
            raise
        response.request = request
        # httpx's transport raises without the request: a failure report needs its URL.
        response.stream = _Attached(response.stream, request)
        return response

    async def aclose(self) -> None:
        await self.transport.aclose()


def make_transport(settings: UpstreamSettings) -> httpx.AsyncBaseTransport:
    if settings.http_client == "builtin":
        return BuiltinTransport(
            max_connections=settings.max_connections,
            keepalive_expiry=30.0,
            max_keepalive_connections=settings.max_keepalive_connections,
        )
    if settings.http_client == "aiohttp":
        return AiohttpTransport(max_connections=settings.max_connections, keepalive_expiry=30.0)
    return httpx.AsyncHTTPTransport(
        limits=httpx.Limits(
            max_connections=settings.max_connections,
            max_keepalive_connections=settings.max_keepalive_connections,
            keepalive_expiry=30.0,
        ),
        trust_env=False,
        retries=0,
    )


def _attach(exc: httpx.HTTPError, request: httpx.Request) -> None:
    try:
        exc.request  # noqa: B018 (raises when unset)
    except RuntimeError:
        exc.request = request


class _Attached(httpx.AsyncByteStream):
    """A response stream whose transport errors carry their request."""

    def __init__(self, stream: Any, request: httpx.Request) -> None:
        self._stream = stream
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._stream:
                yield chunk
        except httpx.HTTPError as exc:
            _attach(exc, self._request)
            raise

    async def aclose(self) -> None:
        await self._stream.aclose()


def upstream_failure(exc: httpx.HTTPError, *, request_id: str | None = None) -> ProxyError:
    """The error for a request that got no usable answer from the upstream (502, or 504 for a
    timeout), logged as ``upstream_failed``.

    The message names the upstream (``scheme://host:port``, never its user information, path
    or query) and why, in plain words (``proxy/upstream/failures.py``); exception texts are not
    forwarded.
    """
    failure = describe(exc)
    code = failure_kind(exc)
    _log_failure(failure, code, request_id)
    return ProxyError(
        504 if code == "upstream_timeout" else 502, failure.message(), type="upstream_error", code=code
    )


def stream_failure(exc: httpx.HTTPError, *, request_id: str | None = None) -> ProxyError:
    """The error event for an answer the upstream broke off after it started (``code``:
    ``upstream_timeout`` or ``upstream_reset``), logged as ``upstream_failed``."""
    failure = describe(exc, streaming=True)
    code = "upstream_timeout" if isinstance(exc, httpx.TimeoutException) else "upstream_reset"
    _log_failure(failure, code, request_id)
    return ProxyError(502, failure.message(), type="upstream_error", code=code)


def _log_failure(failure: Failure, code: str, request_id: str | None) -> None:
    """One line per failure: which upstream, why, and the error the client got; no key,
    header or content (the fields hold only the origin and fixed words)."""
    fields: dict[str, Any] = {
        "upstream": failure.upstream or None,
        "reason": failure.reason,
        "error": code,
        "message": failure.message(),
    }
    if request_id is not None:
        fields["request_id"] = request_id
    _log.warning("upstream_failed", **fields)


def failure_kind(exc: httpx.HTTPError) -> str:
    """The error code a client gets: ``upstream_timeout``; ``upstream_reset`` when the upstream
    was reached but closed the connection before its answer (a stream cut before any byte
    included); else ``upstream_unreachable``."""
    if isinstance(exc, httpx.TimeoutException):
        return "upstream_timeout"
    return "upstream_reset" if classify(exc)[0] == "reset" else "upstream_unreachable"
