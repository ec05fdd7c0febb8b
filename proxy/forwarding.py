"""Header and URL rules for forwarding a request upstream and its response back.

Pure functions over ASGI-style header lists (``[(name, value), ...]`` as lowercase bytes),
so the rules are testable without a server.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from urllib.parse import unquote_to_bytes

Headers = list[tuple[bytes, bytes]]

# RFC 9110 section 7.6.1, plus the de-facto proxy headers.
HOP_BY_HOP: frozenset[bytes] = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)

# Recomputed by the hop that sends the bytes.
_REQUEST_DROP = HOP_BY_HOP | {b"host", b"content-length", b"expect"}
_RESPONSE_DROP = HOP_BY_HOP

# Headers addressed to the proxy itself; the upstream never sees them.
CONTROL_HEADER_PREFIX = b"x-compaction-"


def _connection_tokens(headers: Iterable[tuple[bytes, bytes]]) -> set[bytes]:
    """Header names listed in ``Connection`` are hop-by-hop for this message too."""
    names: set[bytes] = set()
    for name, value in headers:
        if name == b"connection":
            names.update(token.strip().lower() for token in value.split(b",") if token.strip())
    return names


def upstream_request_headers(
    client_headers: Sequence[tuple[bytes, bytes]],
    *,
    fallback_api_key: str | None,
    extra: Iterable[tuple[bytes, bytes]] = (),
) -> Headers:
    """The client's headers as the upstream should receive them.

    The client's own ``Authorization`` wins; the configured key is used only when the
    client sends none, so a deployment can hold the key for clients that have none.
    """
    dropped = _REQUEST_DROP | _connection_tokens(client_headers)
    result: Headers = []
    has_auth = False
    for name, value in client_headers:
        if name in dropped or name.startswith(CONTROL_HEADER_PREFIX):
            continue
        if name == b"authorization":
            has_auth = True
        result.append((name, value))
    if not has_auth and fallback_api_key:
        result.append((b"authorization", b"Bearer " + fallback_api_key.encode("latin-1")))
    result.extend(extra)
    return result


def client_response_headers(upstream_headers: Iterable[tuple[bytes, bytes]]) -> Headers:
    """The upstream's response headers as the client should receive them."""
    upstream_headers = list(upstream_headers)
    dropped = _RESPONSE_DROP | _connection_tokens(upstream_headers)
    return [(name.lower(), value) for name, value in upstream_headers if name.lower() not in dropped]


def header_value(headers: Sequence[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in headers:
        if key == name:
            return value
    return None


def is_safe_path(raw_path: bytes) -> bool:
    """Reject dot segments (plain or percent-encoded) that would climb out of ``/v1``
    once the upstream URL is normalised, and control characters."""
    decoded = unquote_to_bytes(raw_path)
    if any(byte < 0x20 or byte == 0x7F for byte in decoded):
        return False
    return all(segment not in (b".", b"..") for segment in decoded.split(b"/"))


def upstream_url(base_url: str, raw_path: bytes, query_string: bytes, mount: str = "/v1") -> str:
    """``base_url`` (which ends in its own version prefix, e.g. ``/v1``) plus the part of
    the client's path after ``mount``, with the query string kept verbatim."""
    suffix = raw_path.decode("latin-1")[len(mount) :]
    url = base_url.rstrip("/") + suffix
    if query_string:
        url += "?" + query_string.decode("latin-1")
    return url
