"""Requests a browser was tricked into sending: the ``Host`` allowlist, and the data plane's
refusal of cross-site requests when anonymous clients are allowed.

DNS rebinding: a web page at ``evil.example`` re-points its name at ``127.0.0.1``; the browser
then lets the page read whatever this proxy answers, as the same origin, sending
``Host: evil.example``. Every request whose ``Host`` names neither an address, ``localhost``,
``server.host`` nor an entry of ``server.allowed_hosts`` gets a 421 before anything else
happens (no body read, no store, no upstream). An address is always allowed: a rebinding page
is reached by a name the attacker owns, and a browser sends that name, never the address.

Cross-site requests: a page on any site can make a browser POST here without asking (a
"simple request": ``text/plain``, a form); it cannot read the answer, but the upstream is
called and the anonymous tenant's state changes. Such requests carry no credential, so they
matter only where anonymous clients are allowed; there the data plane refuses an anonymous
request a browser marks as another site's (``Sec-Fetch-Site``, ``Origin``) and a POST whose body is not
JSON. Each check reads a few headers once: O(headers), no parsing of anything else.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from proxy.wire.errors import ProxyError, error_body

# The wildcard entry: any Host, for a proxy behind a balancer that checks Host itself.
ANY = "*"
# Addresses a listener binds to mean "every interface", never a name a client sends.
_WILDCARD_BINDS = frozenset({"0.0.0.0", "::", ""})
# Hosts seen, and whether each is allowed; bounded so that a flood of made-up names costs
# a parse each, never memory.
_CACHE_SIZE = 256

MISDIRECTED = error_body(
    "This proxy does not serve the host named in the request's Host header. "
    "Its operator can add the name to server.allowed_hosts.",
    type="invalid_request_error",
    code="misdirected_request",
)
_MISDIRECTED_HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", str(len(MISDIRECTED)).encode()),
    (b"connection", b"close"),
]


def host_name(value: str) -> str:
    """The host of a ``Host`` header value or an ``allowed_hosts`` entry: lower case, without
    its port, brackets or trailing dot (``[::1]:8080`` is ``::1``, ``Proxy.:80`` is ``proxy``)."""
    value = value.strip().lower()
    if value.startswith("["):
        inside, bracket, port = value[1:].partition("]")
        # Anything malformed stays as it is, and so matches no allowed name or address.
        return inside if bracket and (not port or (port[:1] == ":" and port[1:].isdigit())) else value
    name, colon, port = value.partition(":")
    if colon and port.isdigit():
        value = name
    return value.rstrip(".")


def is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostGuard:
    """Whether a request's ``Host`` is one this proxy answers for."""

    def __init__(self, allowed_hosts: Iterable[str], server_host: str) -> None:
        names = {host_name(entry) for entry in allowed_hosts}
        self.any = ANY in names
        names.add("localhost")
        if server_host not in _WILDCARD_BINDS:
            names.add(host_name(f"[{server_host}]" if ":" in server_host else server_host))
        self.names = frozenset(names)
        self._seen: dict[bytes, bool] = {}

    def allows(self, headers: Sequence[tuple[bytes, bytes]]) -> bool:
        """Every ``Host`` header names an allowed host. None at all passes: browsers always
        send one (HTTP/1.0 tools may not), so its absence is no rebinding."""
        if self.any:
            return True
        return all(self._allowed(value) for name, value in headers if name == b"host")

    def _allowed(self, value: bytes) -> bool:
        known = self._seen.get(value)
        if known is None:
            host = host_name(value.decode("latin-1"))
            known = host in self.names or is_address(host)
            if len(self._seen) >= _CACHE_SIZE:
                self._seen.clear()
            self._seen[value] = known
        return known


async def refuse_misdirected(send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    """The 421 in the OpenAI error shape; the connection is closed (the body is never read)."""
    await send({"type": "http.response.start", "status": 421, "headers": _MISDIRECTED_HEADERS})
    await send({"type": "http.response.body", "body": MISDIRECTED})


# Media types a cross-site page can send without a preflight, besides JSON's which it cannot.
_FORM_UPLOAD = b"multipart/form-data"


def cross_site_refusal(method: str, headers: Sequence[tuple[bytes, bytes]]) -> ProxyError | None:
    """Why a data-plane request from a browser page of another site is refused, or None. For
    anonymous requests that are let in only: a page cannot send a credential without a
    preflight, which this proxy never answers.

    - ``Sec-Fetch-Site`` other than ``same-origin``/``none``: the browser says another site sent it.
    - ``Origin`` other than this ``Host``: another origin's page sent it.
    - A POST whose body is not JSON (``application/json``, ``*/*+json``): ``text/plain`` and
      forms are what a page can send unasked. A file upload (``multipart/form-data``) or an
      empty POST with no content type passes only without an ``Origin`` (SDKs send none)."""
    fetch_site = origin = content_type = host = length = None
    for name, value in headers:
        if name == b"sec-fetch-site":
            fetch_site = value
        elif name == b"origin":
            origin = value
        elif name == b"content-type":
            content_type = value
        elif name == b"host":
            host = value
        elif name == b"content-length":
            length = value
    if fetch_site is not None and fetch_site.strip().lower() not in (b"same-origin", b"none"):
        return _forbidden("The request came from a web page of another site.")
    if origin is not None and origin.partition(b"://")[2].lower() != (host or b"").lower():
        return _forbidden("The request came from a web page of another origin.")
    if method != "POST" or (content_type is not None and _is_json(content_type)):
        return None
    if origin is None and content_type is not None and content_type.lower().startswith(_FORM_UPLOAD):
        return None
    if origin is None and content_type is None and length in (None, b"0"):
        return None
    return ProxyError(
        415,
        "The request body must be JSON (Content-Type: application/json).",
        code="unsupported_media_type",
    )


def _is_json(content_type: bytes) -> bool:
    media = content_type.partition(b";")[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


def _forbidden(message: str) -> ProxyError:
    return ProxyError(403, message + " Browser pages may not call this proxy.", code="cross_site_request")
