"""Header and URL rules for forwarding a request upstream and its response back.

Pure functions over ASGI-style header lists (``[(name, value), ...]`` as lowercase bytes),
so the rules are testable without a server.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from urllib.parse import unquote_to_bytes, urlsplit

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

_CREDENTIALS = frozenset({b"authorization", b"api-key", b"x-api-key", b"x-goog-api-key"})

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
    fallback: tuple[bytes, bytes] | None,
    extra: Iterable[tuple[bytes, bytes]] = (),
) -> Headers:
    """The client's headers as the upstream should receive them.

    The client's own credential wins; the configured key (``fallback``: the header that carries
    it, ``authorization: Bearer ...`` for OpenAI, ``x-api-key`` for Anthropic) is added only when
    the client presents none at all (no ``Authorization``, ``api-key`` or ``x-api-key``), so a
    deployment can hold the key for clients that have none, and never adds it to another
    credential.
    """
    dropped = _REQUEST_DROP | _connection_tokens(client_headers)
    result: Headers = []
    has_credential = False
    for name, value in client_headers:
        if name in dropped or name.startswith(CONTROL_HEADER_PREFIX):
            continue
        if name in _CREDENTIALS and value.strip():
            has_credential = True
        result.append((name, value))
    if not has_credential and fallback is not None:
        result.append(fallback)
    result.extend(extra)
    return result


def client_response_headers(upstream_headers: Iterable[tuple[bytes, bytes]]) -> Headers:
    """The upstream's response headers as the client should receive them."""
    upstream_headers = list(upstream_headers)
    dropped = _RESPONSE_DROP | _connection_tokens(upstream_headers)
    return [(name.lower(), value) for name, value in upstream_headers if name.lower() not in dropped]


def key_from_query(query_string: bytes, name: bytes) -> tuple[bytes, bytes | None]:
    """The query without its ``name`` parameter (a key some clients send there, as Google's
    ``?key=``), and that parameter's decoded value (None: absent or empty)."""
    if name + b"=" not in query_string:
        return query_string, None
    kept: list[bytes] = []
    found: bytes | None = None
    for pair in query_string.split(b"&"):
        key, _, value = pair.partition(b"=")
        if unquote_to_bytes(key.replace(b"+", b" ")) == name:
            found = unquote_to_bytes(value.replace(b"+", b" ")) or found
        else:
            kept.append(pair)
    return b"&".join(kept), found


def header_value(headers: Sequence[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in headers:
        if key == name:
            return value
    return None


class UnsafePath(ValueError):
    """A request path that could change where the proxy connects, or climb out of ``/v1``."""


# Percent-escapes of a backslash, which some servers take for a separator. (An escaped slash
# inside a segment, as in a model id `org%2Fmodel`, is kept: the URL is built from parts, and
# the checks below look at the decoded path.)
_HIDDEN_SEPARATORS = (b"%5c",)
_CONTROL_OR_NON_ASCII = re.compile(rb"[\x00-\x1f\x7f-\xff]")
_CONTROL = re.compile(rb"[\x00-\x1f\x7f]")


def is_safe_path(raw_path: bytes) -> bool:
    """Reject dot segments and empty segments (plain or percent-encoded), backslashes (plain
    or encoded), control characters and non-ASCII bytes."""
    lowered = raw_path.lower()
    if _CONTROL_OR_NON_ASCII.search(raw_path):
        return False
    if b"\\" in raw_path or any(escape in lowered for escape in _HIDDEN_SEPARATORS):
        return False
    decoded = raw_path if b"%" not in raw_path else unquote_to_bytes(raw_path)
    if _CONTROL.search(decoded) or b"\\" in decoded:
        return False
    segments = decoded.split(b"/")
    if b"" in segments[1:-1]:
        return False  # "//": an empty segment
    return all(segment not in (b".", b"..") for segment in segments)


class UpstreamBase:
    """The configured upstream, parsed once: requests may only ever go to its scheme, host
    and port, under its path prefix."""

    def __init__(self, base_url: str) -> None:
        parsed = urlsplit(base_url.strip())
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.scheme = parsed.scheme
        self.netloc = parsed.netloc
        self.host = parsed.hostname
        self.port = parsed.port or (443 if parsed.scheme == "https" else 80)
        self.prefix = parsed.path.rstrip("/")
        # Names the upstream without its user information (what is learned of it is kept under it).
        self.key = f"{self.scheme}://{self.host}:{self.port}{self.prefix}"
        # The URLs built so far: a door is a handful of paths, and checking one costs more
        # than looking it up (a URL is only cached once it has passed every check).
        self._built: dict[tuple[bytes, bytes, bytes], str] = {}

    def url(self, raw_path: bytes, query_string: bytes, mount: bytes = b"/v1") -> str:
        """The upstream URL for a client's raw path (``/v1/...``) and query, built from parts
        so that nothing in the path can become a host, a port or user information."""
        key = (raw_path, query_string, mount)
        built = self._built.get(key)
        if built is None:
            built = self._build(raw_path, query_string, mount)
            if len(self._built) < 1024:
                self._built[key] = built
        return built

    def _build(self, raw_path: bytes, query_string: bytes, mount: bytes) -> str:
        if not (raw_path == mount or raw_path.startswith(mount + b"/")) or not is_safe_path(raw_path):
            raise UnsafePath(raw_path)
        suffix = raw_path[len(mount) :].decode("ascii")
        url = f"{self.scheme}://{self.netloc}{self.prefix}{suffix}"
        if query_string:
            query = query_string.decode("latin-1")
            if any(ord(c) <= 0x20 or ord(c) >= 0x7F or c == "#" for c in query):
                raise UnsafePath(raw_path)
            url += "?" + query
        check = urlsplit(url)
        if (check.scheme, check.hostname, check.port or self.port) != (self.scheme, self.host, self.port):
            raise UnsafePath(raw_path)
        return url


def upstream_url(base_url: str, raw_path: bytes, query_string: bytes, mount: str = "/v1") -> str:
    """``base_url`` (which ends in its own version prefix, e.g. ``/v1``) plus the part of
    the client's path after ``mount``, with the query string kept verbatim."""
    return UpstreamBase(base_url).url(raw_path, query_string, mount.encode())
