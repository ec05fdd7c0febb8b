"""OpenAI-style error bodies: ``{"error": {"message", "type", "param", "code"}}``.

The official SDKs read ``error.message`` and ``error.code`` from this shape, so errors the
proxy itself produces surface to agents exactly like the upstream's own.
"""

from __future__ import annotations

import orjson


def error_body(message: str, *, type: str, code: str | None = None, param: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})


class ProxyError(Exception):
    """An error answered to the client with an OpenAI-style body and a status code."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers

    def body(self) -> bytes:
        return error_body(self.message, type=self.type, code=self.code, param=self.param)
