"""The transport shape of the proxy's hot path: a request sent from its parts.

Building an ``httpx.Request`` parses its URL and copies its headers, a cost a proxy pays on
every request for nothing; a ``PartsTransport`` takes the method, URL, headers, body and
timeouts as they are, and makes an ``httpx.Request`` only to name one in an error report.
It stays an httpx transport (``handle_async_request``), so tests and tools can use it as one.
"""

from __future__ import annotations

from typing import Any

import httpx


def request_for_report(method: str, url: str, timeouts: dict[str, Any]) -> httpx.Request:
    """The request an error names (the failure report reads its origin and timeouts)."""
    return httpx.Request(method, url, extensions={"timeout": timeouts})


class PartsTransport(httpx.AsyncBaseTransport):
    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts: dict[str, Any] = request.extensions.get("timeout", {})
        return await self.send(
            request.method, str(request.url), list(request.headers.raw), request.content, timeouts
        )

    async def send(
        self,
        method: str,
        url: str,
        headers: list[tuple[bytes, bytes]],
        content: bytes,
        timeouts: dict[str, Any],
    ) -> httpx.Response:
        """One request; the answer's body is left to stream (close the response when done)."""
        raise NotImplementedError
