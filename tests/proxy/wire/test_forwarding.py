"""Forwarding rules, in process: the app over ``httpx.ASGITransport``, the upstream mocked by respx."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import orjson
import pytest
import respx

from proxy.app import create_app
from proxy.config.settings import load_settings
from proxy.upstream.providers import anthropic_base, make_providers
from proxy.wire.forwarding import (
    UnsafePath,
    UpstreamBase,
    client_response_headers,
    is_safe_path,
    upstream_request_headers,
    upstream_url,
)

UPSTREAM = "http://upstream.test/v1"
CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}


def test_request_headers_drop_hop_by_hop_and_control_headers() -> None:
    headers = [
        (b"host", b"proxy:8080"),
        (b"connection", b"keep-alive, x-secret-hop"),
        (b"x-secret-hop", b"1"),
        (b"keep-alive", b"timeout=5"),
        (b"transfer-encoding", b"chunked"),
        (b"content-length", b"10"),
        (b"x-compaction-policy", b"full"),
        (b"authorization", b"Bearer client"),
        (b"openai-beta", b"assistants=v2"),
    ]
    configured = (b"authorization", b"Bearer sk-conf")
    assert upstream_request_headers(headers, fallback=configured) == [
        (b"authorization", b"Bearer client"),
        (b"openai-beta", b"assistants=v2"),
    ]
    assert configured in upstream_request_headers([], fallback=configured)
    assert upstream_request_headers([], fallback=None) == []


def test_providers_pick_anthropic_by_path_or_version_header() -> None:
    settings = load_settings(
        env={}, overrides={"upstream.api_key": "sk-openai", "anthropic.api_key": "sk-ant-conf"}
    )
    providers = make_providers(settings)
    assert providers.for_request(b"/v1/messages", []).name == "anthropic"
    assert providers.for_request(b"/v1/messages/count_tokens", []).name == "anthropic"
    assert providers.for_request(b"/v1/messagesx", []).name == "openai"
    assert providers.for_request(b"/v1/models", []).name == "openai"
    assert providers.for_request(b"/v1/models", [(b"anthropic-version", b"2023-06-01")]).name == "anthropic"
    anthropic = providers.anthropic
    # The SDK's base URL has no version; the proxy's /v1 paths go under <base>/v1.
    assert (
        anthropic.base.url(b"/v1/messages", b"beta=true") == "https://api.anthropic.com/v1/messages?beta=true"
    )
    assert anthropic_base("http://10.0.0.5:8000/v1/") == "http://10.0.0.5:8000/v1"
    # The configured key goes as x-api-key, only for clients that send no credential.
    assert anthropic.upstream_headers([]) == [(b"x-api-key", b"sk-ant-conf")]
    oauth = [(b"authorization", b"Bearer sk-ant-oat-client")]
    assert anthropic.upstream_headers(oauth) == oauth
    assert providers.openai.upstream_headers([]) == [(b"authorization", b"Bearer sk-openai")]
    assert anthropic.refuse_anonymous and providers.openai.refuse_anonymous


def test_response_headers_keep_useful_ones() -> None:
    headers = [
        (b"Content-Type", b"application/json"),
        (b"x-request-id", b"req_1"),
        (b"retry-after", b"3"),
        (b"x-ratelimit-remaining-tokens", b"10"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Connection", b"close"),
    ]
    assert client_response_headers(headers) == [
        (b"content-type", b"application/json"),
        (b"x-request-id", b"req_1"),
        (b"retry-after", b"3"),
        (b"x-ratelimit-remaining-tokens", b"10"),
    ]


@pytest.mark.parametrize(
    ("path", "safe"),
    [
        (b"/v1/chat/completions", True),
        (b"/v1/files/abc%20def", True),
        (b"/v1/../admin", False),
        (b"/v1/%2e%2e/admin", False),
        (b"/v1/./x", False),
        (b"/v1/a%0d%0aX-Injected: 1", False),
    ],
)
def test_dot_segments_and_control_characters_are_refused(path: bytes, safe: bool) -> None:
    assert is_safe_path(path) is safe


def test_upstream_url_keeps_path_and_query_verbatim() -> None:
    assert upstream_url("https://api.example.com/v1/", b"/v1/files/a%2Fb", b"limit=2&after=x%20y") == (
        "https://api.example.com/v1/files/a%2Fb?limit=2&after=x%20y"
    )
    assert upstream_url("http://h:1/openai/v1", b"/v1/models", b"") == "http://h:1/openai/v1/models"


def test_a_built_url_is_looked_up_and_an_unsafe_one_is_refused_every_time() -> None:
    base = UpstreamBase("https://api.example.com/v1")
    first = base.url(b"/v1/chat/completions", b"a=1")
    assert base.url(b"/v1/chat/completions", b"a=1") is first
    assert base.url(b"/v1/chat/completions", b"a=2") == "https://api.example.com/v1/chat/completions?a=2"
    for _ in range(2):
        with pytest.raises(UnsafePath):
            base.url(b"/v1/../admin", b"")


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    settings = load_settings(
        env={},
        overrides={"upstream.base_url": UPSTREAM, "upstream.http_client": "httpx", "upstream.timeout": 1.0},
    )
    app = create_app(settings)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as c:
        yield c
    await app.state.upstream.aclose()


@respx.mock
async def test_chat_is_forwarded_with_headers_and_bytes(client: httpx.AsyncClient) -> None:
    route = respx.post(f"{UPSTREAM}/chat/completions").mock(
        return_value=httpx.Response(200, json={"ok": True}, headers={"x-request-id": "req_up"})
    )
    body = orjson.dumps(CHAT) + b"  "
    response = await client.post(
        "/v1/chat/completions?api-version=1", content=body, headers={"authorization": "Bearer c"}
    )
    assert response.status_code == 200
    assert response.json() == {"ok": True}
    sent = route.calls.last.request
    assert sent.content == body
    assert sent.url.query == b"api-version=1"
    assert sent.headers["authorization"] == "Bearer c"
    assert "user-agent" not in sent.headers or "python-httpx" in sent.headers.get("user-agent", "")
    assert response.headers["x-request-id"] == "req_up"
    assert response.headers["x-compaction-request-id"].startswith("cpx-")
    assert response.headers["x-compaction-tokens-before"] == response.headers["x-compaction-tokens-after"]


@respx.mock
@pytest.mark.parametrize(
    ("failure", "status", "code"),
    [
        (httpx.ConnectError("refused sk-leak"), 502, "upstream_unreachable"),
        (httpx.RemoteProtocolError("closed sk-leak"), 502, "upstream_reset"),
        (httpx.ReadTimeout("slow sk-leak"), 504, "upstream_timeout"),
        (httpx.ConnectTimeout("slow sk-leak"), 504, "upstream_timeout"),
    ],
)
async def test_transport_failures_map_to_gateway_errors(
    client: httpx.AsyncClient, failure: Exception, status: int, code: str
) -> None:
    respx.post(f"{UPSTREAM}/chat/completions").mock(side_effect=failure)
    response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code
    # The configured upstream, by scheme, host and port; the exception's own text is not forwarded.
    assert error["message"].startswith("The upstream http://upstream.test:80 ")
    assert "sk-leak" not in error["message"]


@respx.mock
async def test_unsafe_paths_never_reach_the_upstream(client: httpx.AsyncClient) -> None:
    route = respx.route().mock(return_value=httpx.Response(200))
    response = await client.get("/v1/%2e%2e/secret")
    assert response.status_code == 400
    assert not route.called


@respx.mock
async def test_passthrough_relays_status_and_body(client: httpx.AsyncClient) -> None:
    respx.get(f"{UPSTREAM}/files/f1/content").mock(
        return_value=httpx.Response(404, content=b"<not json>", headers={"content-type": "text/plain"})
    )
    response = await client.get("/v1/files/f1/content")
    assert (response.status_code, response.content, response.headers["content-type"]) == (
        404,
        b"<not json>",
        "text/plain",
    )


async def test_admin_prefix_is_not_forwarded(client: httpx.AsyncClient) -> None:
    with respx.mock(assert_all_called=False) as mock:
        route = mock.route().mock(return_value=httpx.Response(200))
        response = await client.get("/v1/compaction/unknown")
    assert response.status_code == 404
    assert not route.called
