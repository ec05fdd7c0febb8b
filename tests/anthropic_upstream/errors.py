"""Anthropic's error answers, as the real API sends them, and the failures the fake injects.

Every error body is ``{"type": "error", "error": {"type", "message"}, "request_id"}``; the
status picks the type (400 ``invalid_request_error``, 401 ``authentication_error``, 404
``not_found_error``, 429 ``rate_limit_error``, 500 ``api_error``, 529 ``overloaded_error``),
which is what the ``anthropic`` SDK maps to its exception classes. The context-window messages
are the real ones: ``prompt is too long: N tokens > W maximum`` when the prompt alone exceeds
the window, and ``input length and `max_tokens` exceed context limit: N + M > W, ...`` when
only the prompt plus ``max_tokens`` does.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any, Literal

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
MESSAGES = {
    400: "Invalid request",
    401: "invalid x-api-key",
    404: "Not Found",
    429: (
        "This request would exceed the rate limit for your organization of 50 requests per minute. "
        "For details, refer to: https://docs.claude.com/en/api/rate-limits. You can see the response "
        "headers for current usage. Please reduce the prompt length or the maximum tokens requested, "
        "or try again later. You may also contact sales at https://www.anthropic.com/contact-sales to "
        "discuss your options for a rate limit increase."
    ),
    500: "Internal server error",
    529: "Overloaded",
}
THINKING_DOCS = "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def b58(*parts: Any, size: int = 22) -> str:
    """A deterministic base58 string (the alphabet of Anthropic's ids) derived from ``parts``."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    while len(digest) < size:
        digest += hashlib.sha256(digest).digest()
    return "".join(_B58[b % 58] for b in digest[:size])


def request_id(*parts: Any) -> str:
    return "req_011C" + b58("request", *parts, size=20)


def error_body(status: int, message: str | None = None, *, rid: str = "") -> dict[str, Any]:
    return {
        "type": "error",
        "error": {
            "type": ERROR_TYPES.get(status, "api_error"),
            "message": message if message is not None else MESSAGES.get(status, "Error"),
        },
        "request_id": rid or None,
    }


def prompt_too_long(tokens: int, max_tokens: int, window: int) -> str:
    """The real 400 message for a request over the window."""
    if tokens > window:
        return f"prompt is too long: {tokens} tokens > {window} maximum"
    return (
        f"input length and `max_tokens` exceed context limit: {tokens} + {max_tokens} > {window}, "
        "decrease input length or `max_tokens` and try again"
    )


def too_many_breakpoints(found: int) -> str:
    return f"A maximum of 4 blocks with cache_control may be provided. Found {found}."


def rate_limit_headers(retry_after: str | None) -> dict[str, str]:
    """What the real API sends with a 429: ``retry-after`` (seconds) and the
    ``anthropic-ratelimit-*`` family (limits, what is left, when it resets, RFC 3339)."""
    reset = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60))
    headers = {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": reset,
        "anthropic-ratelimit-input-tokens-limit": "30000",
        "anthropic-ratelimit-input-tokens-remaining": "0",
        "anthropic-ratelimit-input-tokens-reset": reset,
        "anthropic-ratelimit-output-tokens-limit": "8000",
        "anthropic-ratelimit-output-tokens-remaining": "8000",
        "anthropic-ratelimit-output-tokens-reset": reset,
        "anthropic-ratelimit-tokens-limit": "38000",
        "anthropic-ratelimit-tokens-remaining": "0",
        "anthropic-ratelimit-tokens-reset": reset,
    }
    if retry_after is not None:
        headers["retry-after"] = retry_after
    return headers


def base_headers(rid: str) -> dict[str, str]:
    return {
        "request-id": rid,
        "anthropic-organization-id": "00000000-0000-4000-8000-000000000000",
        "server": "cloudflare",
    }


@dataclass(frozen=True)
class Failure:
    """How to fail a request. ``status``: answer ``status`` (400, 401, 429, 500, 529, ...) with
    Anthropic's error body (a 429 carries ``retry-after: retry_after`` and the rate-limit
    headers). ``stream_error``: a streamed request gets ``after_events`` events of the answer it
    would have had, then ``event: error`` with ``overloaded_error`` (a non-streamed one gets HTTP
    529). ``reset``: the connection is cut after ``after_events`` events (before any byte for a
    non-streamed request). A failed request never advances the run: a retry gets the answer the
    failed one would have had."""

    kind: Literal["status", "stream_error", "reset"] = "status"
    status: int = 500
    after_events: int = 4
    retry_after: str | None = "0"
    message: str | None = None

    def body(self, rid: str) -> dict[str, Any]:
        status = 529 if self.kind == "stream_error" else self.status
        return error_body(status, self.message, rid=rid)

    def headers(self) -> dict[str, str]:
        return rate_limit_headers(self.retry_after) if self.status == 429 else {}
