"""Credentials that are not ASCII: an ``Authorization`` header (or an admin token) with other
characters is a 401 on the events and sessions routes, never a 500 (``hmac.compare_digest``
raises on such text), and a token that is not ASCII works when sent as UTF-8."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from proxy.app import ProxyApp, create_app
from proxy.config.settings import load_settings


def make_app(tmp_path: Path, token: str) -> ProxyApp:
    settings = load_settings(
        env={},
        overrides={
            "upstream.base_url": "http://upstream.test/v1",
            "state_dir": str(tmp_path),
            "server.admin_token": token,
        },
    )
    return create_app(settings, transport=httpx.MockTransport(lambda request: httpx.Response(500)))


def send(app: ProxyApp, method: str, path: str, headers: dict[str, bytes]) -> httpx.Response:
    async def run() -> httpx.Response:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost"
        ) as c:
            return await c.request(method, path, headers=headers)

    return asyncio.run(run())


@pytest.mark.parametrize("path", ["/v1/compaction/events", "/v1/compaction/sessions"])
@pytest.mark.parametrize(
    "authorization", ["Bearer s\u00e9cret".encode(), "Bearer s\u00e9cret".encode("latin-1"), b"\xff\xfe"]
)
def test_a_non_ascii_authorization_is_a_401_not_a_500(
    tmp_path: Path, path: str, authorization: bytes
) -> None:
    app = make_app(tmp_path, "secret")
    response = send(app, "GET", path, {"authorization": authorization})
    assert response.status_code == 401, response.text
    assert response.json()["error"]["type"] == "authentication_error"


def test_a_non_ascii_admin_token_is_compared_as_utf8(tmp_path: Path) -> None:
    app = make_app(tmp_path, "s\u00e9cret-\u2603")
    right = "Bearer s\u00e9cret-\u2603".encode()
    assert send(app, "GET", "/v1/compaction/sessions", {"authorization": right}).status_code == 200
    for wrong in (b"Bearer secret", "Bearer s\u00e9cret-\u2603".encode("utf-16"), b""):
        assert send(app, "GET", "/v1/compaction/sessions", {"authorization": wrong}).status_code == 401
