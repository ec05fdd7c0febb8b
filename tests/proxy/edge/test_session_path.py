"""A session in the base URL: ``/s/<session>/v1/...`` is ``/v1/...`` with ``X-Session-Id``, for
clients that cannot send a header (a client's own header wins)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from proxy.app import create_app
from proxy.config.settings import load_settings
from proxy.edge.session_path import with_path_session


def scope(path: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> dict[str, object]:
    return {"type": "http", "path": path.decode(), "raw_path": path, "headers": headers or []}


def test_the_prefix_is_stripped_and_becomes_the_session_header() -> None:
    got = with_path_session(scope(b"/s/wrap-20260101-000000-abc123/v1/chat/completions"))
    assert got["path"] == "/v1/chat/completions" and got["raw_path"] == b"/v1/chat/completions"
    assert got["headers"] == [(b"x-session-id", b"wrap-20260101-000000-abc123")]
    # Anthropic-style base URLs (no /v1) append /v1/messages; a probe of the base URL is "/".
    assert with_path_session(scope(b"/s/run-1/v1/messages"))["path"] == "/v1/messages"
    assert with_path_session(scope(b"/s/run-1"))["path"] == "/"


def test_a_clients_own_header_wins() -> None:
    own = [(b"x-session-id", b"mine")]
    got = with_path_session(scope(b"/s/run-1/v1/responses", own))
    assert got["path"] == "/v1/responses" and got["headers"] == own


def test_other_paths_and_malformed_prefixes_are_left_alone() -> None:
    plain = scope(b"/v1/chat/completions")
    assert with_path_session(plain) is plain
    for path in (b"/s//v1/models", b"/s/a%20b/v1/models", b"/s/" + b"x" * 201 + b"/v1/models"):
        assert with_path_session(scope(path))["path"] == path.decode()


def test_a_prefixed_request_reaches_the_upstream_with_the_session(tmp_path: Path) -> None:
    seen: list[httpx.Request] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"object": "list", "data": []})

    settings = load_settings(
        env={}, overrides={"upstream.base_url": "http://upstream.test/v1", "state_dir": str(tmp_path)}
    )
    app = create_app(settings, transport=httpx.MockTransport(upstream))

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost"
        ) as c:
            key = {"authorization": "Bearer sk-test"}
            return [await c.get("/s/run-7/v1/models", headers=key), await c.head("/s/run-7")]

    models, probe = asyncio.run(run())
    assert models.status_code == 200 and probe.status_code == 200
    assert seen[0].url.path == "/v1/models" and seen[0].headers["x-session-id"] == "run-7"
