"""Why a request got no usable answer from the upstream, in words an operator can act on.

A transport error is classified by walking its chain (``__cause__``, ``__context__``, and the
members of an exception group): every transport keeps the original error there, httpx's own
(through httpcore), ``BuiltinTransport`` and ``AiohttpTransport`` (``raise ... from``). The
reasons:

- ``dns``: the host name could not be resolved;
- ``refused``: nothing listens at the host and port;
- ``tls``: the TLS handshake failed (a certificate, or a server that does not speak TLS);
- ``connect_timeout``: no connection within ``upstream.connect_timeout`` (or no free one in
  the pool);
- ``read_timeout``: the upstream stopped sending for ``upstream.timeout``;
- ``reset``: the connection was closed or reset before the answer was complete;
- ``other``: anything else.

The words never quote an exception's text: only fixed phrases, the upstream's scheme, host and
port, the timeout settings and, for TLS and socket errors, the library's short reason (OpenSSL's
reason code, a certificate's verify message, an errno's name), which hold no header, key or
request content.
"""

from __future__ import annotations

import errno
import os
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp
import httpx

# Errors that end a connection early (httpcore's are mapped to these by httpx).
_RESET_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionResetError,
    ConnectionAbortedError,
    BrokenPipeError,
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientPayloadError,
    httpx.RemoteProtocolError,
    httpx.ReadError,
    httpx.WriteError,
)
_TLS_ERRORS: tuple[type[BaseException], ...] = (
    ssl.SSLError,
    ssl.CertificateError,
    aiohttp.ClientSSLError,
    aiohttp.ServerFingerprintMismatch,
)
_DNS_ERRORS: tuple[type[BaseException], ...] = (socket.gaierror, aiohttp.ClientConnectorDNSError)
_MAX_DETAIL = 120
# OpenSSL's reasons when the server answers a handshake in plain HTTP (by OpenSSL version).
_PLAIN_HTTP = frozenset({"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"})


@dataclass(frozen=True, slots=True)
class Failure:
    """A classified upstream failure: ``upstream`` is ``scheme://host:port`` (or ``""`` when
    the request is unknown), ``reason`` one of the kinds above, ``words`` the client's message
    without its first words (e.g. ``"could not be reached: connection refused."``)."""

    upstream: str
    reason: str
    words: str

    def message(self, prefix: str = "The upstream") -> str:
        who = f"{prefix} {self.upstream}" if self.upstream else prefix
        return f"{who} {self.words}"


def chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception, its causes and contexts, and the members of exception groups (each once)."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if isinstance(current, aiohttp.ClientConnectorCertificateError):
            pending.append(current.certificate_error)
        elif isinstance(current, aiohttp.ClientConnectorError):
            pending.append(current.os_error)
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                pending.append(linked)
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)


def origin(url: httpx.URL) -> str:
    """``scheme://host:port`` of a URL: never its user information, path or query."""
    host = url.host
    if ":" in host:  # IPv6
        host = f"[{host}]"
    port = url.port or (443 if url.scheme == "https" else 80)
    return f"{url.scheme}://{_printable(host)}:{port}"


def _printable(text: str) -> str:
    cleaned = "".join(c if c.isprintable() else "?" for c in text)
    return cleaned[:_MAX_DETAIL]


def _seconds(value: object) -> str:
    return f"{value:g} s" if isinstance(value, int | float) else "the configured time"


def _tls_detail(errors: list[BaseException]) -> str:
    for error in errors:
        verify = getattr(error, "verify_message", None)
        if isinstance(error, ssl.SSLCertVerificationError) and verify:
            return f"certificate verify failed: {_printable(str(verify))}"
    for error in errors:
        if isinstance(error, aiohttp.ServerFingerprintMismatch):
            return "certificate fingerprint mismatch"
        reason = getattr(error, "reason", None)
        if isinstance(error, ssl.SSLError) and isinstance(reason, str) and reason:
            words = _printable(reason.replace("_", " ").lower())
            return f"{words}: is it a plain http:// server?" if reason in _PLAIN_HTTP else words
        if isinstance(error, ssl.SSLEOFError | ssl.SSLZeroReturnError):
            return "the server closed the connection during the handshake"
    return "no details"


def _os_detail(errors: list[BaseException]) -> str | None:
    """The name of the first errno in the chain (``ENETUNREACH: network is unreachable``)."""
    for error in errors:
        number = getattr(error, "errno", None)
        if isinstance(error, OSError) and isinstance(number, int) and number > 0:
            name = errno.errorcode.get(number)
            words = os.strerror(number).lower()
            return f"{name}: {words}" if name else words
    return None


def _request(exc: BaseException) -> httpx.Request | None:
    for error in chain(exc):
        if isinstance(error, httpx.RequestError):
            try:
                return error.request
            except RuntimeError:  # httpx's transport does not attach it
                continue
    return None


def classify(exc: BaseException) -> tuple[str, list[BaseException]]:
    """The reason for a transport failure (see the module's list), and the errors of its chain."""
    errors = list(chain(exc))
    if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout | aiohttp.ConnectionTimeoutError):
        return "connect_timeout", errors
    if isinstance(exc, httpx.TimeoutException | TimeoutError | aiohttp.ServerTimeoutError):
        return "read_timeout", errors
    for reason, kinds in (
        ("dns", _DNS_ERRORS),
        ("tls", _TLS_ERRORS),
        ("refused", (ConnectionRefusedError,)),
        ("reset", _RESET_ERRORS),
    ):
        if any(isinstance(error, kinds) for error in errors):
            return reason, errors
    return "other", errors


def describe(exc: BaseException, *, streaming: bool = False) -> Failure:
    """The failure of a request to the upstream; ``streaming``: the answer had started."""
    reason, errors = classify(exc)
    request = _request(exc)
    upstream = origin(request.url) if request is not None else ""
    timeouts = request.extensions.get("timeout", {}) if request is not None else {}
    if reason == "dns":
        name = f"the name {_printable(request.url.host)}" if request is not None else "its name"
        words = f"could not be reached: {name} could not be resolved (DNS)."
    elif reason == "refused":
        words = "could not be reached: connection refused."
    elif reason == "tls":
        words = f"could not be reached: TLS handshake failed ({_tls_detail(errors)})."
    elif reason == "connect_timeout" and isinstance(exc, httpx.PoolTimeout):
        words = (
            f"could not be reached: no pooled connection was free within {_seconds(timeouts.get('pool'))} "
            "(upstream.max_connections are all busy)."
        )
    elif reason == "connect_timeout":
        words = (
            f"could not be reached: no connection within {_seconds(timeouts.get('connect'))} "
            "(upstream.connect_timeout)."
        )
    elif reason == "read_timeout":
        read = _seconds(timeouts.get("read"))
        words = (
            f"stopped sending in the middle of the answer for {read} (upstream.timeout)."
            if streaming
            else f"did not answer within {read} (upstream.timeout)."
        )
    elif reason == "reset":
        words = (
            "closed the connection in the middle of the answer."
            if streaming
            else "closed the connection before the answer was complete."
        )
    else:
        detail = _os_detail(errors)
        if isinstance(exc, httpx.ConnectError):
            words = f"could not be reached: {detail}." if detail else "could not be reached."
        else:
            words = f"failed: {detail or _kind(exc)}."
    return Failure(upstream=upstream, reason=reason, words=words)


def _kind(exc: BaseException) -> str:
    """A transport error's class, as words (``UnsupportedProtocol``: unsupported protocol)."""
    name = type(exc).__name__
    words = "".join(f" {c.lower()}" if c.isupper() else c for c in name).strip()
    return words or "transport error"
