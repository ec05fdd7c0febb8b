"""The real proxy process, a real fake upstream, and the official ``openai`` SDK between them."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.fake_upstream import FakeUpstream, Reply, chunk, completion, text_stream

pytestmark = pytest.mark.e2e
JSON = {"content-type": "application/json"}

KEY = "sk-test-secret-key-0123456789abcdef"
MESSAGES: list[Any] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say ok. SECRET-CONTENT-MARKER"},
]


def sdk(proxy: Any, **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=proxy.base_url, api_key=KEY, max_retries=kwargs.pop("max_retries", 0), **kwargs
    )


def test_non_stream_answer_is_identical_to_direct(proxy: Any, upstream: FakeUpstream) -> None:
    direct = openai.OpenAI(base_url=upstream.base_url, api_key=KEY, max_retries=0)
    via_direct = direct.chat.completions.with_raw_response.create(model="gpt-4o", messages=MESSAGES)
    via_proxy = sdk(proxy).chat.completions.with_raw_response.create(model="gpt-4o", messages=MESSAGES)
    assert via_proxy.http_response.content == via_direct.http_response.content
    assert via_proxy.parse().choices[0].message.content == "ok"
    headers = via_proxy.headers
    # The built-in default policy: a request under its trigger goes byte for byte.
    assert headers["x-compaction-policy"] == "improved"
    assert headers["x-compaction-tokens-before"] == headers["x-compaction-tokens-after"]
    assert int(headers["x-compaction-tokens-before"]) > 10
    assert headers["x-request-id"].startswith("cpx-")
    # The upstream received the SDK's bytes unchanged, and the same headers but hop-by-hop ones.
    sent_direct, sent_proxy = upstream.requests
    assert sent_proxy.body == sent_direct.body
    assert sent_proxy.headers["authorization"] == f"Bearer {KEY}"
    assert sent_proxy.headers["user-agent"] == sent_direct.headers["user-agent"]


async def test_async_non_stream_and_stream(proxy: Any, upstream: FakeUpstream) -> None:
    client = openai.AsyncOpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0)
    answer = await client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert answer.choices[0].message.content == "ok"
    upstream.queue(Reply(kind="sse", chunks=text_stream(["Hel", "lo", " there"])))
    stream = await client.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True)
    parts = [c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content]
    assert parts == ["Hel", "lo", " there"]
    await client.close()


def test_sync_stream_chunks_in_order(proxy: Any, upstream: FakeUpstream) -> None:
    words = [f"w{i} " for i in range(50)]
    upstream.queue(Reply(kind="sse", chunks=text_stream(words)))
    stream = sdk(proxy).chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True)
    got = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
    assert got == words


def test_stream_framing_is_relayed_byte_for_byte(proxy: Any, upstream: FakeUpstream) -> None:
    raw = [
        b": keep-alive comment\n\n",
        b"event: message\ndata: " + orjson.dumps(chunk("x", role=True)) + b"\r\n\r\n",
    ]
    upstream.queue(Reply(kind="sse", chunks=[*raw, chunk(None, finish="stop")]))
    body = {"model": "m", "messages": MESSAGES, "stream": True}
    received = httpx.post(
        proxy.base_url + "/chat/completions", json=body, headers={"authorization": "Bearer k"}
    )
    expected = b"".join(raw) + b"data: " + orjson.dumps(chunk(None, finish="stop")) + b"\n\ndata: [DONE]\n\n"
    assert received.content == expected
    assert received.headers["content-type"] == "text/event-stream"


def test_stream_is_not_buffered(proxy: Any, upstream: FakeUpstream) -> None:
    delay = 0.25
    upstream.queue(Reply(kind="sse", chunks=text_stream(["a", "b", "c", "d"]), chunk_delay=delay))
    body = {"model": "m", "messages": MESSAGES, "stream": True}
    arrivals: list[float] = []
    start = time.perf_counter()
    with httpx.stream("POST", proxy.base_url + "/chat/completions", json=body, timeout=10) as response:
        for _ in response.iter_raw():
            arrivals.append(time.perf_counter() - start)
    # 6 events spaced by `delay`: had the proxy buffered, everything would arrive at the end.
    assert arrivals[0] < delay
    assert arrivals[-1] > 4 * delay
    assert len(arrivals) >= 5


def test_tool_calls_reach_the_sdk(proxy: Any, upstream: FakeUpstream) -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "execute_bash", "arguments": '{"command": "ls"}'},
    }
    upstream.queue(Reply(body=completion(tool_calls=[call])))
    tools: list[Any] = [
        {
            "type": "function",
            "function": {
                "name": "execute_bash",
                "description": "Run a command",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
            },
        }
    ]
    answer = sdk(proxy).chat.completions.create(model="gpt-4o", messages=MESSAGES, tools=tools)
    tool_call = answer.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert tool_call.function.name == "execute_bash"  # type: ignore[union-attr]
    assert upstream.requests[-1].json()["tools"] == tools


@pytest.mark.parametrize(
    ("status", "exception", "error_type"),
    [
        (400, openai.BadRequestError, "invalid_request_error"),
        (401, openai.AuthenticationError, "invalid_api_key"),
        (429, openai.RateLimitError, "rate_limit_exceeded"),
        (500, openai.InternalServerError, "server_error"),
    ],
)
def test_upstream_errors_reach_the_sdk_unchanged(
    proxy: Any, upstream: FakeUpstream, status: int, exception: type[Exception], error_type: str
) -> None:
    body = {
        "error": {"message": f"upstream says {status}", "type": error_type, "param": None, "code": error_type}
    }
    upstream.queue(
        Reply(
            status=status,
            body=body,
            headers={
                "retry-after": "7",
                "x-request-id": "req_upstream_1",
                "x-ratelimit-remaining-requests": "0",
            },
        )
    )
    with pytest.raises(exception) as caught:
        sdk(proxy).chat.completions.create(model="gpt-4o", messages=MESSAGES)
    error: Any = caught.value
    assert error.status_code == status
    assert error.body == body["error"]
    assert error.response.headers["retry-after"] == "7"
    assert error.response.headers["x-ratelimit-remaining-requests"] == "0"
    assert error.response.headers["x-request-id"] == "req_upstream_1"
    assert error.request_id == "req_upstream_1"


def test_sdk_retries_work_through_the_proxy(proxy: Any, upstream: FakeUpstream) -> None:
    busy = {"error": {"message": "busy", "type": "server_error", "param": None, "code": None}}
    upstream.queue(
        Reply(status=503, body=busy, headers={"retry-after-ms": "10"}),
        Reply(status=429, body=busy, headers={"retry-after-ms": "10"}),
    )
    answer = sdk(proxy, max_retries=3).chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert answer.choices[0].message.content == "ok"
    assert len(upstream.requests) == 3
    assert [r.headers.get("x-stainless-retry-count") for r in upstream.requests] == ["0", "1", "2"]


def test_mid_stream_reset_raises_in_the_sdk(proxy: Any, upstream: FakeUpstream) -> None:
    upstream.queue(Reply(kind="sse", chunks=text_stream(["a", "b", "c", "d"]), reset_after=2, done=False))
    stream = sdk(proxy).chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True)
    received: list[str] = []
    with pytest.raises(
        openai.APIError,
        match=r"The upstream http://127\.0\.0\.1:\d+ closed the connection in the middle of the answer\.",
    ):
        for part in stream:
            if part.choices and part.choices[0].delta.content:
                received.append(part.choices[0].delta.content)
    assert received == ["a"]


def test_client_disconnect_cancels_the_upstream_stream(proxy: Any, upstream: FakeUpstream) -> None:
    upstream.queue(Reply(kind="sse", chunks=text_stream([f"{i}" for i in range(100)]), chunk_delay=0.05))
    body = {"model": "m", "messages": MESSAGES, "stream": True}
    with httpx.stream("POST", proxy.base_url + "/chat/completions", json=body, timeout=10) as response:
        next(response.iter_raw())
    deadline = time.monotonic() + 5
    while upstream.cancelled_streams == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert upstream.cancelled_streams == 1
    time.sleep(0.2)
    records = [orjson.loads(line) for line in proxy.log_lines() if '"event":"request"' in line]
    assert records[-1]["error"] == "client_disconnected"


def test_passthrough_routes_are_forwarded_verbatim(proxy: Any, upstream: FakeUpstream) -> None:
    client = sdk(proxy)
    assert [m.id for m in client.models.list()] == ["fake-model"]
    assert upstream.requests[-1].method == "GET" and upstream.requests[-1].path == "/v1/models"
    embeddings_body = b'{"model": "text-embedding-3-small",  "input": ["a"]}'
    upstream.queue(Reply(body={"object": "list", "data": []}))
    response = httpx.post(
        proxy.base_url + "/embeddings?x=1&y=%2F",
        content=embeddings_body,
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 200
    recorded = upstream.requests[-1]
    assert (recorded.path, recorded.query, recorded.body) == ("/v1/embeddings", "x=1&y=%2F", embeddings_body)
    deleted = httpx.delete(proxy.base_url + "/files/file-abc")
    assert deleted.json()["echo"] == {"method": "DELETE", "path": "/v1/files/file-abc", "query": ""}
    # Passthrough responses carry no compaction headers.
    assert "x-compaction-policy" not in deleted.headers


def test_client_authorization_wins_and_configured_key_fills_in(
    start_proxy: Any, upstream: FakeUpstream
) -> None:
    proxy = start_proxy(
        {"upstream": {"api_key": "sk-configured-key-000000000000"}, "server": {"allow_anonymous": True}}
    )
    body = {"model": "m", "messages": MESSAGES}
    httpx.post(proxy.base_url + "/chat/completions", json=body)
    httpx.post(proxy.base_url + "/chat/completions", json=body, headers={"authorization": "Bearer sk-client"})
    assert upstream.requests[0].headers["authorization"] == "Bearer sk-configured-key-000000000000"
    assert upstream.requests[1].headers["authorization"] == "Bearer sk-client"


def test_hop_by_hop_and_control_headers_are_not_forwarded(proxy: Any, upstream: FakeUpstream) -> None:
    body = {"model": "m", "messages": MESSAGES}
    headers = {
        "connection": "keep-alive, x-private-hop",
        "x-private-hop": "1",
        "proxy-authorization": "Basic abc",
        "te": "trailers",
        "x-compaction-policy": "full",
        "x-custom": "kept",
        "openai-organization": "org-1",
    }
    httpx.post(proxy.base_url + "/chat/completions", json=body, headers=headers)
    seen = upstream.requests[-1].headers
    for dropped in ("x-private-hop", "proxy-authorization", "te", "x-compaction-policy"):
        assert dropped not in seen
    assert seen["x-custom"] == "kept"
    assert seen["openai-organization"] == "org-1"


def test_original_bytes_are_forwarded_unchanged(proxy: Any, upstream: FakeUpstream) -> None:
    body = (
        b'{ "messages" : [ {"content": "caf\\u00e9 \xe2\x9c\x93", "role": "user",'
        b' "x-unknown": {"n": 1.50}} ],'
        b' "model": "gpt-4o", "temperature": 1e0, "big": 123456789012345678901234567890 }'
    )
    response = httpx.post(
        proxy.base_url + "/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 200
    assert upstream.requests[-1].body == body


def test_upstream_unreachable_is_502(start_proxy: Any) -> None:
    from tests.fake_upstream import free_port

    proxy = start_proxy({"upstream": {"base_url": f"http://127.0.0.1:{free_port()}/v1"}})
    with pytest.raises(openai.APIStatusError) as caught:
        sdk(proxy).chat.completions.create(model="gpt-4o", messages=MESSAGES)
    error: Any = caught.value
    assert error.status_code == 502
    assert error.body["code"] == "upstream_unreachable"
    assert error.body["type"] == "upstream_error"


def test_upstream_timeout_is_504(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy({"upstream": {"timeout": 0.3}})
    upstream.queue(Reply(kind="hang"))
    with pytest.raises(openai.APIStatusError) as caught:
        sdk(proxy).chat.completions.create(model="gpt-4o", messages=MESSAGES)
    error: Any = caught.value
    assert error.status_code == 504
    assert error.body["code"] == "upstream_timeout"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "could not parse the JSON body"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"model": "m"}', "'messages' is a required property"),
        (b'{"model": "m", "messages": "hi"}', "'messages' is a required property"),
        (b"\xff\xfe{", "could not parse the JSON body"),
    ],
)
def test_bad_requests_get_openai_style_400(
    proxy: Any, upstream: FakeUpstream, body: bytes, message: str
) -> None:
    # As an SDK sends it (a keyless POST that is not JSON is refused earlier, 415: cross-site).
    response = httpx.post(proxy.base_url + "/chat/completions", content=body, headers=JSON)
    assert response.status_code == 400
    error = response.json()["error"]
    assert message in error["message"]
    assert error["type"] == "invalid_request_error"
    assert upstream.requests == []


def test_body_over_the_limit_is_413(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy({"server": {"max_body_bytes": 4096}})
    response = httpx.post(proxy.base_url + "/chat/completions", content=b"x" * 5000, headers=JSON)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"

    def chunked() -> Any:
        for _ in range(10):
            yield b"y" * 1000

    response = httpx.post(proxy.base_url + "/chat/completions", content=chunked(), headers=JSON)
    assert response.status_code == 413
    assert upstream.requests == []


def test_unknown_policy_is_400_listing_valid_ones(proxy: Any) -> None:
    client = sdk(proxy)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="m", messages=MESSAGES, extra_headers={"X-Compaction-Policy": "nope"}
        )
    assert "Valid policies: full" in str(caught.value)


def test_mode_off_relays_without_parsing(proxy: Any, upstream: FakeUpstream) -> None:
    response = httpx.post(
        proxy.base_url + "/chat/completions",
        content=b"not even json",
        headers={"x-compaction-mode": "off", **JSON},
    )
    assert response.status_code == 200
    assert upstream.requests[-1].body == b"not even json"
    assert response.headers["x-compaction-mode"] == "off"
    assert "x-compaction-tokens-before" not in response.headers


def test_health_ready_and_metrics(proxy: Any) -> None:
    assert httpx.get(proxy.url + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(proxy.url + "/readyz").json()
    assert ready["status"] == "ready" and ready["service"] == "compaction-proxy"
    # Its identity names the configuration by a digest and holds no secret.
    assert len(ready["config_digest"]) == 16 and ready["policy"] and ready["mode"]
    sdk(proxy).chat.completions.create(model="gpt-4o", messages=MESSAGES)
    metrics = httpx.get(proxy.url + "/metrics").text
    assert (
        'compaction_proxy_requests_total{mode="enforce",policy="full",route="chat",status_class="2xx"}'
        in metrics
    )


def test_logs_are_json_without_keys_or_content(proxy: Any, upstream: FakeUpstream) -> None:
    sdk(proxy).chat.completions.create(model="gpt-4o", messages=MESSAGES)
    upstream.queue(
        Reply(status=401, body={"error": {"message": "bad key", "type": "x", "param": None, "code": None}})
    )
    with pytest.raises(openai.AuthenticationError):
        sdk(proxy).chat.completions.create(model="gpt-4o", messages=MESSAGES)
    time.sleep(0.1)
    lines = proxy.log_lines()[-2:]
    text = "\n".join(proxy.log_lines())
    assert KEY not in text and KEY[3:20] not in text
    assert "SECRET-CONTENT-MARKER" not in text
    requests = [orjson.loads(line) for line in lines if '"event":"request"' in line]
    assert [r["status"] for r in requests] == [200, 401]
    for record in requests:
        assert {
            "request_id",
            "route",
            "status",
            "upstream_s",
            "overhead_s",
            "tokens_before",
            "tokens_after",
        } <= set(record)


async def test_concurrent_streams_do_not_mix(proxy: Any, upstream: FakeUpstream) -> None:
    client = openai.AsyncOpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0)

    async def one(i: int) -> str:
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    results = await asyncio.gather(*(one(i) for i in range(20)))
    assert results == ["ok"] * 20
    await client.close()


def test_other_model_family_loads_its_encoding_on_first_use(proxy: Any, upstream: FakeUpstream) -> None:
    # gpt-4 counts with cl100k_base, which the proxy loads when first needed (off the event loop).
    raw = sdk(proxy).chat.completions.with_raw_response.create(model="gpt-4-0613", messages=MESSAGES)
    gpt4 = int(raw.headers["x-compaction-tokens-before"])
    raw = sdk(proxy).chat.completions.with_raw_response.create(model="gpt-4o", messages=MESSAGES)
    assert gpt4 > 10 and int(raw.headers["x-compaction-tokens-before"]) > 10
