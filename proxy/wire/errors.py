"""Error bodies in each provider's shape, for the errors the proxy itself produces.

OpenAI: ``{"error": {"message", "type", "param", "code"}}``; Anthropic: ``{"type": "error",
"error": {"type", "message"}}``; Google (Gemini, Code Assist): ``{"error": {"code", "message",
"status"}}``, ``status`` the canonical code's name. The official SDKs read these shapes (and
raise by status), so errors the proxy makes surface to agents exactly like the upstream's own.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson


def error_body(message: str, *, type: str, code: str | None = None, param: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})


# Anthropic's error types by status (its SDKs choose the exception class by status).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


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


# A provider's error body for an error the proxy answers itself.
ErrorBody = Callable[[ProxyError], bytes]


def anthropic_error_body(error: ProxyError) -> bytes:
    kind = _ANTHROPIC_TYPES.get(error.status) or (
        "api_error" if error.status >= 500 else "invalid_request_error"
    )
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": error.message}})


def openai_error_body(error: ProxyError) -> bytes:
    return error.body()


# Google's canonical codes by HTTP status (``google.rpc.Code`` as its APIs map them).
_GOOGLE_STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def google_error_body(error: ProxyError) -> bytes:
    status = _GOOGLE_STATUSES.get(error.status) or ("INTERNAL" if error.status >= 500 else "INVALID_ARGUMENT")
    return orjson.dumps({"error": {"code": error.status, "message": error.message, "status": status}})
