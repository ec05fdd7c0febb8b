"""A path the proxy does not serve: a 404 in the error shape of the API the client speaks, saying
where the API is (``@ai-sdk/anthropic`` given a base URL without ``/v1`` posts ``/messages``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import orjson

from proxy.app import create_app
from proxy.config.settings import load_settings


def ask(tmp_path: Path, method: str, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    app = create_app(
        load_settings(
            env={}, overrides={"upstream.base_url": "http://upstream.test/v1", "state_dir": str(tmp_path)}
        ),
        transport=httpx.MockTransport(lambda request: httpx.Response(500)),
    )

    async def run() -> httpx.Response:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost"
        ) as client:
            return await client.request(method, path, headers=headers, content=b"{}")

    return asyncio.run(run())


def test_messages_without_v1_is_an_anthropic_error_naming_the_right_url(tmp_path: Path) -> None:
    response = ask(tmp_path, "POST", "/messages", {"anthropic-version": "2023-06-01"})
    assert response.status_code == 404 and response.headers["content-type"].startswith("application/json")
    body = orjson.loads(response.content)
    assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
    assert "Did you mean /v1/messages?" in body["error"]["message"]


def test_another_unknown_path_is_an_openai_error(tmp_path: Path) -> None:
    response = ask(tmp_path, "POST", "/chat/completions")
    body = orjson.loads(response.content)
    assert response.status_code == 404 and body["error"]["code"] == "not_found"
    assert "Did you mean /v1/chat/completions?" in body["error"]["message"]
    other = orjson.loads(ask(tmp_path, "GET", "/nothing-here").content)
    assert "under /v1" in other["error"]["message"]
