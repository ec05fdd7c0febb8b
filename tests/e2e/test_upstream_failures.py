"""The real proxy process, with each HTTP client: an upstream failure's JSON log line names the
upstream and the reason, next to the request's own line, and no key reaches the log."""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson
import pytest

from tests.fake_upstream import FakeUpstream, Reply, free_port

pytestmark = pytest.mark.e2e

CLIENT_KEY = "sk-client-e2e-5c1f0a9d7b3e2468"
CONFIG_KEY = "sk-config-e2e-8a2d4f6b0c1e3579"
CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "SECRET-CONTENT-MARKER"}]}
MESSAGES = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 16,
    "messages": [{"role": "user", "content": "SECRET-CONTENT-MARKER"}],
}


def records(proxy: Any, event: str) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in proxy.log_lines() if f'"event":"{event}"' in line]


@pytest.mark.parametrize("http_client", ["builtin", "aiohttp", "httpx"])
def test_failures_are_logged_with_upstream_and_reason(
    start_proxy: Any, upstream: FakeUpstream, http_client: str
) -> None:
    """OpenAI's side answers nothing in time; nothing listens on Anthropic's side."""
    port = free_port()
    openai_side = upstream.base_url.removesuffix("/v1")
    proxy = start_proxy(
        {
            "upstream": {"timeout": 0.3, "api_key": CONFIG_KEY, "http_client": http_client},
            "anthropic": {"base_url": f"http://127.0.0.1:{port}", "api_key": CONFIG_KEY},
            "server": {"allow_anonymous": True},
        }
    )
    upstream.queue(Reply(kind="hang"))
    timed_out = httpx.post(
        proxy.base_url + "/chat/completions",
        json=CHAT,
        headers={"authorization": f"Bearer {CLIENT_KEY}"},
        timeout=20,
    )
    assert timed_out.status_code == 504
    assert timed_out.json()["error"]["code"] == "upstream_timeout"
    assert timed_out.json()["error"]["message"] == (
        f"The upstream {openai_side} did not answer within 0.3 s (upstream.timeout)."
    )
    refused = []
    for headers in ({"x-api-key": CLIENT_KEY}, {}):  # without one, the configured key goes upstream
        response = httpx.post(
            proxy.base_url + "/messages",
            json=MESSAGES,
            headers={**headers, "anthropic-version": "2023-06-01"},
            timeout=20,
        )
        assert response.status_code == 502
        assert response.json()["error"] == {
            "type": "api_error",
            "message": f"The upstream http://127.0.0.1:{port} could not be reached: connection refused.",
        }
        refused.append(response)

    time.sleep(0.2)  # the access log line follows the response
    for response, origin, reason, code in (
        (timed_out, openai_side, "read_timeout", "upstream_timeout"),
        *[(r, f"http://127.0.0.1:{port}", "refused", "upstream_unreachable") for r in refused],
    ):
        request_id = response.headers["x-compaction-request-id"]
        (failure,) = [r for r in records(proxy, "upstream_failed") if r.get("request_id") == request_id]
        assert (failure["upstream"], failure["reason"], failure["error"]) == (origin, reason, code)
        assert failure["level"] == "warning"
        assert failure["message"] == response.json()["error"]["message"]
        (line,) = [r for r in records(proxy, "request") if r["request_id"] == request_id]
        assert line["error"] == code
    text = proxy.log_path.read_text()
    for secret in (CLIENT_KEY, CONFIG_KEY, "SECRET-CONTENT-MARKER"):
        assert secret not in text
