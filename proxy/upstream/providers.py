"""The upstream providers a request can go to, and how a request picks one.

Every ``/v1`` request goes to OpenAI's side (``upstream``: OpenAI or any OpenAI-compatible
server) unless it is an Anthropic request: ``/v1/messages`` and its sub-routes
(``count_tokens``, ``batches``), ``/v1/complete``, or any request carrying the
``anthropic-version`` header every Anthropic SDK sends (``/v1/models`` and ``/v1/files`` exist
on both sides: the header tells them apart). ``/v1beta/...`` and ``/v1alpha/...`` are the
Gemini API's, ``/v1internal:...`` Gemini CLI's Code Assist's. A provider knows its base URL and
the path it stands for there (``mount``: ``/v1`` for OpenAI and Anthropic, whose base URL ends
there; none for Google's, whose base is the API's root and the client's path is the whole
path), the header that carries the configured key for clients that send none, the query
parameter a key may come in instead (Gemini's ``?key=``: moved into that header, so it is never
part of a URL), and the shape of its error bodies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from proxy.config.settings import Settings
from proxy.wire.errors import ErrorBody, anthropic_error_body, google_error_body, openai_error_body
from proxy.wire.forwarding import UpstreamBase, header_value, upstream_request_headers

Headers = list[tuple[bytes, bytes]]
_ANTHROPIC_PATHS = (b"/v1/messages", b"/v1/complete")
GEMINI_PATHS = (b"/v1beta/", b"/v1alpha/")
CODE_ASSIST_PATHS = (b"/v1internal:", b"/v1internal/")
# The paths the data plane serves: besides every /v1 path, Google's.
DATA_PLANE_PREFIXES = tuple(p.decode() for p in (*GEMINI_PATHS, *CODE_ASSIST_PATHS))


@dataclass(frozen=True, slots=True)
class Provider:
    name: str  # "openai", "anthropic", "gemini" or "code_assist"
    base: UpstreamBase
    # The header carrying the configured key, added when the client sends no credential.
    fallback: tuple[bytes, bytes] | None
    # Clients without a credential would spend the configured key as one shared tenant.
    refuse_anonymous: bool
    error_body: ErrorBody
    # The client path the base URL stands for (b"": the base is the API's root).
    mount: bytes = b"/v1"
    # The query parameter a client may send its key in, moved into ``key_header``.
    query_key: bytes | None = None
    key_header: bytes = b""

    def url(self, raw_path: bytes, query_string: bytes) -> str:
        return self.base.url(raw_path, query_string, self.mount)

    def upstream_headers(self, client_headers: Sequence[tuple[bytes, bytes]]) -> Headers:
        return upstream_request_headers(client_headers, fallback=self.fallback)


def anthropic_base(base_url: str) -> str:
    """Anthropic's base URL as its SDKs take it (``https://api.anthropic.com``, no version),
    as the proxy mounts it: its ``/v1`` routes under ``<base>/v1``."""
    parts = urlsplit(base_url.strip())
    path = parts.path.rstrip("/")
    if not path.endswith("/v1"):
        path += "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


@dataclass(frozen=True, slots=True)
class Providers:
    openai: Provider
    anthropic: Provider
    gemini: Provider
    code_assist: Provider

    def by_name(self, name: str) -> Provider:
        """The provider a door's row names."""
        provider: Provider = getattr(self, name)
        return provider

    def for_request(self, raw_path: bytes, headers: Sequence[tuple[bytes, bytes]]) -> Provider:
        if raw_path.startswith(GEMINI_PATHS):
            return self.gemini
        if raw_path.startswith(CODE_ASSIST_PATHS):
            return self.code_assist
        if any(raw_path == p or raw_path.startswith(p + b"/") for p in _ANTHROPIC_PATHS):
            return self.anthropic
        if header_value(headers, b"anthropic-version") is not None:
            return self.anthropic
        return self.openai


def make_providers(settings: Settings) -> Providers:
    anonymous = settings.server.allow_anonymous
    openai_key = settings.upstream.api_key
    anthropic_key = settings.anthropic.api_key
    gemini_key = settings.gemini.api_key
    return Providers(
        openai=Provider(
            name="openai",
            base=UpstreamBase(settings.upstream.base_url),
            fallback=(b"authorization", b"Bearer " + openai_key.encode("latin-1")) if openai_key else None,
            refuse_anonymous=bool(openai_key) and not anonymous,
            error_body=openai_error_body,
        ),
        anthropic=Provider(
            name="anthropic",
            base=UpstreamBase(anthropic_base(settings.anthropic.base_url)),
            fallback=(b"x-api-key", anthropic_key.encode("latin-1")) if anthropic_key else None,
            refuse_anonymous=bool(anthropic_key) and not anonymous,
            error_body=anthropic_error_body,
        ),
        gemini=Provider(
            name="gemini",
            base=UpstreamBase(settings.gemini.base_url),
            fallback=(b"x-goog-api-key", gemini_key.encode("latin-1")) if gemini_key else None,
            refuse_anonymous=bool(gemini_key) and not anonymous,
            error_body=google_error_body,
            mount=b"",
            query_key=b"key",
            key_header=b"x-goog-api-key",
        ),
        # A Google login's OAuth token, always the client's own: no key is configured for it.
        code_assist=Provider(
            name="code_assist",
            base=UpstreamBase(settings.gemini.code_assist_url),
            fallback=None,
            refuse_anonymous=False,
            error_body=google_error_body,
            mount=b"",
        ),
    )
