"""Requests a browser was tricked into sending.

- DNS rebinding: a ``Host`` that names neither an address, ``localhost``, ``server.host`` nor
  an ``allowed_hosts`` entry gets a 421 before anything is read (no body, no upstream).
- With anonymous clients let in, an anonymous data-plane request a browser page of another
  site could send unasked (``text/plain``, a form, ``Origin``/``Sec-Fetch-Site`` of another
  site) is refused before its body is read."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import msgspec
import orjson
import pytest

from proxy.app import ProxyApp, create_app
from proxy.config.settings import ConfigError, load_settings
from proxy.edge.host_guard import HostGuard, host_name

CHAT = orjson.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})


def make_app(tmp_path: Path, seen: list[httpx.Request], **overrides: Any) -> ProxyApp:
    def upstream(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"object": "list", "data": []})

    settings = load_settings(
        env={},
        overrides={"upstream.base_url": "http://upstream.test/v1", "state_dir": str(tmp_path), **overrides},
    )
    return create_app(settings, transport=httpx.MockTransport(upstream))


def send(app: ProxyApp, method: str, path: str, headers: dict[str, Any], body: bytes = b"") -> httpx.Response:
    async def run() -> httpx.Response:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost"
        ) as c:
            return await c.request(method, path, headers=headers, content=body)

    return asyncio.run(run())


# --- the Host allowlist ---------------------------------------------------------------------


class NoBody:
    """An ASGI receive that fails the test if the body is read."""

    async def __call__(self) -> dict[str, Any]:
        raise AssertionError("the body was read")


def raw_request(
    app: ProxyApp, method: str, path: str, headers: list[tuple[bytes, bytes]]
) -> tuple[int, bytes]:
    sent: list[dict[str, Any]] = []

    async def collect(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "headers": headers}
    asyncio.run(app(scope, NoBody(), collect))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


@pytest.mark.parametrize(
    "path", ["/v1/compaction/events", "/v1/compaction/sessions", "/v1/chat/completions", "/ui"]
)
def test_a_rebound_host_gets_a_421_before_anything_is_read(tmp_path: Path, path: str) -> None:
    seen: list[httpx.Request] = []
    app = make_app(tmp_path, seen)  # keyless upstream: anonymous clients are let in
    headers = [(b"host", b"evil.example:8080"), (b"content-type", b"application/json")]
    status, body = raw_request(app, "POST" if "chat" in path else "GET", path, headers)
    assert status == 421 and not seen
    error = orjson.loads(body)["error"]
    assert error["code"] == "misdirected_request" and error["type"] == "invalid_request_error"


def test_loopback_names_addresses_and_listed_names_are_served(tmp_path: Path) -> None:
    seen: list[httpx.Request] = []
    app = make_app(tmp_path, seen, **{"server.allowed_hosts": ["proxy.internal", "Other.Example:9000"]})
    hosts = (
        "localhost", "localhost:8080", "LOCALHOST.", "127.0.0.1", "127.0.0.1:8080", "[::1]", "[::1]:8080",
        "10.1.2.3:8080", "proxy.internal", "proxy.internal:443", "other.example",
    )  # fmt: skip
    for host in hosts:
        assert send(app, "GET", "/v1/models", {"host": host}).status_code == 200, host
    for host in ("evil.example", "proxy.internal.evil.example", "localhost.evil.example", "[::1"):
        assert send(app, "GET", "/v1/models", {"host": host}).status_code == 421, host
    assert len(seen) == len(hosts)


def test_server_host_and_the_wildcard() -> None:
    guard = HostGuard((), "proxy.lan")
    assert guard.allows([(b"host", b"proxy.lan:8080")]) and not guard.allows([(b"host", b"evil.example")])
    assert HostGuard((), "0.0.0.0").names == {"localhost"}
    assert HostGuard(("*",), "127.0.0.1").allows([(b"host", b"anything.example")])
    # No Host at all (an HTTP/1.0 tool) is no rebinding; every Host of several must pass.
    assert guard.allows([]) and not guard.allows([(b"host", b"proxy.lan"), (b"host", b"evil.example")])
    assert host_name("[::1]:80") == "::1" and host_name("Proxy.:80") == "proxy" and host_name("::1") == "::1"


def test_allowed_hosts_entries_are_checked_at_start(tmp_path: Path) -> None:
    for entry in ("http://proxy.internal", "proxy.internal/v1", "a b"):
        with pytest.raises((ConfigError, msgspec.ValidationError)):
            load_settings(env={}, overrides={"server.allowed_hosts": [entry], "state_dir": str(tmp_path)})
    ok = load_settings(env={}, overrides={"server.allowed_hosts": ["*", "[::1]:80", "::1", "proxy:8080"]})
    assert ok.server.allowed_hosts == ("*", "[::1]:80", "::1", "proxy:8080")


# --- cross-site requests when anonymous clients are let in ----------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        [(b"content-type", b"text/plain")],
        [(b"content-type", b"application/x-www-form-urlencoded")],
        [(b"content-type", b"multipart/form-data; boundary=x"), (b"origin", b"http://localhost:3000")],
        [(b"content-length", b"12")],
        [(b"content-type", b"application/json"), (b"origin", b"https://evil.example")],
        [(b"content-type", b"application/json"), (b"origin", b"null")],
        [(b"content-type", b"application/json"), (b"sec-fetch-site", b"cross-site")],
    ],
)
def test_an_anonymous_cross_site_request_is_refused_before_it_is_read(
    tmp_path: Path, headers: list[tuple[bytes, bytes]]
) -> None:
    seen: list[httpx.Request] = []
    app = make_app(tmp_path, seen)
    status, body = raw_request(app, "POST", "/v1/chat/completions", [(b"host", b"localhost:8080"), *headers])
    assert status in (403, 415) and not seen
    assert orjson.loads(body)["error"]["code"] in ("cross_site_request", "unsupported_media_type")


def test_the_cross_site_rule_leaves_clients_alone(tmp_path: Path) -> None:
    seen: list[httpx.Request] = []
    app = make_app(tmp_path, seen, **{"server.allow_anonymous": True, "upstream.api_key": "sk-configured"})
    json = {"content-type": "application/json"}
    fine = [
        ("POST", "/v1/chat/completions", json, CHAT),
        ("POST", "/v1/chat/completions", {"content-type": "application/vnd.api+json; charset=utf-8"}, CHAT),
        (
            "POST",
            "/v1/chat/completions",
            {**json, "origin": "http://localhost", "sec-fetch-site": "same-origin"},
            CHAT,
        ),
        ("POST", "/v1/audio/transcriptions", {"content-type": "multipart/form-data; boundary=x"}, b"--x--"),
        ("POST", "/v1/responses/r_1/cancel", {}, b""),
        # A credential needs a preflight no page passes: the rule is for anonymous requests.
        (
            "POST",
            "/v1/chat/completions",
            {"authorization": "Bearer sk-c", "content-type": "text/plain"},
            CHAT,
        ),
    ]
    for method, path, headers, body in fine:
        response = send(app, method, path, headers, body)
        assert response.status_code == 200, (path, headers, response.text)
    assert len(seen) == len(fine)
    # A page's GET of another origin is refused too (it could not read the answer, but the
    # upstream would be called for it).
    assert send(app, "GET", "/v1/models", {"origin": "https://evil.example"}).status_code == 403
    assert len(seen) == len(fine)
