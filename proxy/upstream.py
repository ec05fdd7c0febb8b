"""The pooled upstream connection and the mapping of transport failures to client errors."""

from __future__ import annotations

from typing import Any

import httpx

from proxy.errors import ProxyError
from proxy.settings import UpstreamSettings
from proxy.transport import AiohttpTransport


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
        request = httpx.Request(
            method, url, headers=headers, content=content, extensions={"timeout": self.timeout}
        )
        response = await self.transport.handle_async_request(request)
        response.request = request
        return response

    async def aclose(self) -> None:
        await self.transport.aclose()


def make_transport(settings: UpstreamSettings) -> httpx.AsyncBaseTransport:
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


def upstream_failure(exc: httpx.HTTPError) -> ProxyError:
    """An OpenAI-style error for a request that got no usable answer from the upstream.

    Exception texts are not forwarded: they can name internal hosts.
    """
    if isinstance(exc, httpx.TimeoutException):
        return ProxyError(
            504, "The upstream API did not answer in time.", type="upstream_error", code="upstream_timeout"
        )
    return ProxyError(
        502,
        "The upstream API could not be reached or closed the connection.",
        type="upstream_error",
        code="upstream_unreachable",
    )


def failure_kind(exc: httpx.HTTPError) -> str:
    return "upstream_timeout" if isinstance(exc, httpx.TimeoutException) else "upstream_unreachable"
