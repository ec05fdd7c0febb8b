"""Upstream failures say which upstream and why, with both HTTP clients, in process: the app
over ``httpx.ASGITransport``, the upstream a real listener on 127.0.0.1 that misbehaves (or
nothing at all). The client's body and the log name ``http://127.0.0.1:<port>`` and the reason;
no key (the client's or the configured one) reaches either."""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from structlog.testing import capture_logs

from proxy.app import create_app
from proxy.config.settings import load_settings
from proxy.upstream.failures import describe, origin
from proxy.upstream.pool import stream_failure, upstream_failure
from tests.fake_upstream import free_port
from tests.needs import service_binary

CLIENT_KEY = "sk-client-7f3a9c2e5b1d4f60"
CONFIG_KEY = "sk-config-0d8e6b4a2c9f1e37"
SECRETS = (CLIENT_KEY, CONFIG_KEY)
CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "the-prompt-text"}]}
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
DEADLINE = 20.0  # no request of these tests may take longer


@pytest.fixture(params=["builtin", "aiohttp", "httpx"])
def http_client(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@asynccontextmanager
async def listener(handler: Handler, tls: ssl.SSLContext | None = None) -> AsyncIterator[int]:
    """A server on a free loopback port; every connection is closed when the test is done."""
    writers: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for writer in writers:
            writer.close()
        await asyncio.wait_for(server.wait_closed(), 5)


async def read_head(reader: asyncio.StreamReader) -> None:
    await reader.readuntil(b"\r\n\r\n")


async def never_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_head(reader)
    await reader.read()  # until the proxy gives up and closes


async def closes_after_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_head(reader)


async def speaks_plain_http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.read(1024)  # a TLS ClientHello, answered in plain HTTP
    writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
    await writer.drain()


def streams_then(end: str) -> Handler:
    """An event stream that sends one chunk, then closes (``reset``) or goes silent (``hang``)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        event = b'data: {"id":"c","object":"chat.completion.chunk","choices":[%s]}\n\n' % (
            b'{"index":0,"delta":{"content":"hel"}}'
        )
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            + f"{len(event):x}\r\n".encode()
            + event
            + b"\r\n"
        )
        await writer.drain()
        if end == "hang":
            await reader.read()

    return handler


@asynccontextmanager
async def proxy(
    tmp_path: Path, http_client: str, base_url: str, *, timeout: float = 10.0
) -> AsyncIterator[httpx.AsyncClient]:
    settings = load_settings(
        env={},
        overrides={
            "state_dir": str(tmp_path),
            "upstream.base_url": base_url + "/v1",
            "upstream.api_key": CONFIG_KEY,
            "upstream.http_client": http_client,
            "upstream.timeout": timeout,
            "upstream.connect_timeout": 5.0,
            "anthropic.base_url": base_url,
            "anthropic.api_key": CONFIG_KEY,
            "server.allow_anonymous": True,
        },
    )
    app = create_app(settings)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost"
        ) as client:
            yield client
    finally:
        await app.state.upstream.aclose()


async def post(
    client: httpx.AsyncClient, body: dict[str, Any], path: str = "/v1/chat/completions", **headers: str
) -> httpx.Response:
    return await asyncio.wait_for(client.post(path, json=body, headers=headers), DEADLINE)


def failure_lines(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["event"] == "upstream_failed"]


def assert_no_secrets(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text
        assert "the-prompt-text" not in text


async def assert_reported(
    client: httpx.AsyncClient, upstream: str, status: int, code: str, reason: str, words: str
) -> None:
    """Both credentials (the client's own, and none: the configured key goes upstream) get the
    same report, ``The upstream <upstream> <words>...``, in the body and in the log."""
    messages = []
    with capture_logs() as logs:
        for headers in ({"authorization": f"Bearer {CLIENT_KEY}"}, {}):
            response = await post(client, CHAT, **headers)
            assert response.status_code == status, response.text
            error = response.json()["error"]
            assert (error["code"], error["type"]) == (code, "upstream_error")
            messages.append(error["message"])
            assert_no_secrets(response.text)
    assert messages[0] == messages[1]
    assert messages[0].startswith(f"The upstream {upstream} {words}"), messages[0]
    assert "/v1" not in messages[0] and "chat/completions" not in messages[0]
    lines = failure_lines(logs)
    assert len(lines) == 2
    for line in lines:
        assert (line["upstream"], line["reason"], line["error"]) == (upstream, reason, code)
        assert line["request_id"].startswith("cpx-") and line["log_level"] == "warning"
    assert_no_secrets(repr(logs))


@pytest.mark.parametrize(
    ("server", "scheme", "reason", "words"),
    [
        (None, "http", "refused", "could not be reached: connection refused."),  # nothing listens
        (speaks_plain_http, "https", "tls", "could not be reached: TLS handshake failed ("),
        (never_answers, "http", "read_timeout", "did not answer within 0.3 s (upstream.timeout)."),
        (closes_after_request, "http", "reset", "closed the connection before the answer was complete."),
    ],
    ids=["refused", "tls-to-plain-http", "read-timeout", "closed-after-request"],
)
async def test_failure_names_upstream_and_reason(
    tmp_path: Path, http_client: str, server: Handler | None, scheme: str, reason: str, words: str
) -> None:
    status, code = {
        "read_timeout": (504, "upstream_timeout"),
        # Reached, then cut before the answer: named as such, not as unreachable.
        "reset": (502, "upstream_reset"),
    }.get(reason, (502, "upstream_unreachable"))
    async with AsyncExitStack() as stack:
        port = free_port() if server is None else await stack.enter_async_context(listener(server))
        upstream = f"{scheme}://127.0.0.1:{port}"
        client = await stack.enter_async_context(proxy(tmp_path, http_client, upstream, timeout=0.3))
        await assert_reported(client, upstream, status, code, reason, words)


@pytest.fixture
def offline_dns(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Names under ``.invalid`` fail at once, as a resolver answers NXDOMAIN, never asking the
    network (both clients resolve through ``loop.getaddrinfo``, hence ``socket.getaddrinfo``)."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else str(host)
        if name.rstrip(".").endswith(".invalid"):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield


async def test_dns(tmp_path: Path, http_client: str, offline_dns: None) -> None:
    upstream = "https://api.example.invalid:8443"
    words = "could not be reached: the name api.example.invalid could not be resolved (DNS)."
    async with proxy(tmp_path, http_client, upstream) as client:
        await assert_reported(client, upstream, 502, "upstream_unreachable", "dns", words)


def self_signed(directory: Path) -> ssl.SSLContext:
    """A server context with a throwaway self-signed certificate (made by the openssl CLI)."""
    openssl = service_binary("openssl")  # makes a throwaway certificate
    cert, key = directory / "cert.pem", directory / "key.pem"
    arguments = f"req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 -keyout {key} -out {cert}"
    subprocess.run([openssl, *arguments.split()], check=True, capture_output=True, timeout=60)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


async def test_tls_certificate_not_trusted(tmp_path: Path, http_client: str) -> None:
    words = "could not be reached: TLS handshake failed (certificate verify failed: self"
    async with listener(never_answers, self_signed(tmp_path)) as port:
        upstream = f"https://127.0.0.1:{port}"
        async with proxy(tmp_path, http_client, upstream) as client:
            await assert_reported(client, upstream, 502, "upstream_unreachable", "tls", words)


@pytest.mark.parametrize(
    ("end", "code", "reason", "words"),
    [
        ("reset", "upstream_reset", "reset", "closed the connection in the middle of the answer."),
        ("hang", "upstream_timeout", "read_timeout", "stopped sending in the middle of the answer for 0.3 s"),
    ],
)
async def test_a_stream_broken_off(
    tmp_path: Path, http_client: str, end: str, code: str, reason: str, words: str
) -> None:
    async with (
        listener(streams_then(end)) as port,
        proxy(tmp_path, http_client, f"http://127.0.0.1:{port}", timeout=0.3) as client,
    ):
        with capture_logs() as logs:
            response = await post(client, {**CHAT, "stream": True}, authorization=f"Bearer {CLIENT_KEY}")
    assert response.status_code == 200
    assert b'"content":"hel"' in response.content
    last = response.content.strip().split(b"\n\n")[-1]
    assert last.startswith(b"data: ") and b"[DONE]" not in response.content
    error = orjson.loads(last[len(b"data: ") :])["error"]
    assert error["code"] == code
    assert error["message"].startswith(f"The upstream http://127.0.0.1:{port} {words}")
    (line,) = failure_lines(logs)
    assert (line["upstream"], line["reason"], line["error"]) == (f"http://127.0.0.1:{port}", reason, code)
    assert_no_secrets(response.text, repr(logs))


async def test_anthropic_door_in_its_own_shape(tmp_path: Path, http_client: str) -> None:
    upstream = f"http://127.0.0.1:{free_port()}"
    body = {"model": "claude-sonnet-4-5", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    async with proxy(tmp_path, http_client, upstream) as client:
        with capture_logs() as logs:
            response = await post(
                client, body, "/v1/messages", **{"x-api-key": CLIENT_KEY, "anthropic-version": "2023-06-01"}
            )
    assert response.status_code == 502
    assert response.json() == {
        "type": "error",
        "error": {
            "type": "api_error",
            "message": f"The upstream {upstream} could not be reached: connection refused.",
        },
    }
    (line,) = failure_lines(logs)
    assert (line["upstream"], line["reason"]) == (upstream, "refused")
    assert_no_secrets(response.text, repr(logs))


async def test_responses_door(tmp_path: Path, http_client: str) -> None:
    async with (
        listener(never_answers) as port,
        proxy(tmp_path, http_client, f"http://127.0.0.1:{port}", timeout=0.3) as client,
    ):
        response = await post(
            client, {"model": "gpt-4o", "input": "hi"}, "/v1/responses", authorization=f"Bearer {CLIENT_KEY}"
        )
    assert response.status_code == 504
    error = response.json()["error"]
    assert error["code"] == "upstream_timeout"
    assert error["message"] == (
        f"The upstream http://127.0.0.1:{port} did not answer within 0.3 s (upstream.timeout)."
    )


# The classification and the words, from the errors each transport raises.

REQUEST = httpx.Request(
    "POST",
    "https://user:pw-secret@api.example.com/v1/chat/completions?key=sk-query",
    extensions={"timeout": httpx.Timeout(600.0, connect=10.0).as_dict()},
)


def raised(error: httpx.HTTPError, cause: BaseException | None = None) -> httpx.HTTPError:
    """``error`` as a transport raises it: from ``cause``, with its request."""
    error.request = REQUEST
    error.__cause__ = cause
    return error


def test_origin_is_scheme_host_and_port_only() -> None:
    assert origin(REQUEST.url) == "https://api.example.com:443"
    assert origin(httpx.URL("http://[::1]:8080/v1")) == "http://[::1]:8080"
    assert origin(httpx.URL("http://h/v1")) == "http://h:80"


@pytest.mark.parametrize(
    ("error", "reason", "status", "words"),
    [
        (
            raised(httpx.ConnectTimeout("sk-x")),
            "connect_timeout",
            504,
            "could not be reached: no connection within 10 s (upstream.connect_timeout).",
        ),
        (
            raised(httpx.PoolTimeout("sk-x")),
            "connect_timeout",
            504,
            "could not be reached: no pooled connection was free within 600 s "
            "(upstream.max_connections are all busy).",
        ),
        (
            raised(httpx.ReadTimeout("sk-x")),
            "read_timeout",
            504,
            "did not answer within 600 s (upstream.timeout).",
        ),
        (
            # httpx through anyio: every address refused, in a group.
            raised(
                httpx.ConnectError("sk-x"),
                OSError("All connection attempts failed"),
            ),
            "other",
            502,
            "could not be reached.",
        ),
        (
            raised(httpx.ConnectError("sk-x"), ExceptionGroup("all", [ConnectionRefusedError(111, "sk-x")])),
            "refused",
            502,
            "could not be reached: connection refused.",
        ),
        (
            raised(httpx.ConnectError("sk-x"), OSError(101, "sk-x")),
            "other",
            502,
            "could not be reached: ENETUNREACH: network is unreachable.",
        ),
        (
            raised(httpx.ReadError("sk-x"), ConnectionResetError(104, "sk-x")),
            "reset",
            502,
            "closed the connection before the answer was complete.",
        ),
        (raised(httpx.UnsupportedProtocol("sk-x")), "other", 502, "failed: unsupported protocol."),
    ],
)
def test_reasons_and_words(error: httpx.HTTPError, reason: str, status: int, words: str) -> None:
    failure = describe(error)
    assert (failure.upstream, failure.reason, failure.words) == ("https://api.example.com:443", reason, words)
    proxy_error = upstream_failure(error)
    assert proxy_error.status == status
    assert proxy_error.message == f"The upstream https://api.example.com:443 {words}"
    for leak in ("sk-", "pw-secret", "user", "/v1", "key="):
        assert leak not in proxy_error.message


def test_certificate_verify_message_is_kept() -> None:
    verify = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    verify.verify_message = "Hostname mismatch, certificate is not valid for 'api.example.com'."
    verify.reason = "CERTIFICATE_VERIFY_FAILED"
    failure = describe(raised(httpx.ConnectError("sk-x"), verify))
    assert failure.reason == "tls"
    assert failure.words == (
        "could not be reached: TLS handshake failed (certificate verify failed: "
        "Hostname mismatch, certificate is not valid for 'api.example.com'.)."
    )


def test_a_failure_without_its_request_still_has_words() -> None:
    failure = describe(httpx.ConnectError("sk-x"))
    assert failure.upstream == ""
    assert failure.message() == "The upstream could not be reached."


def test_stream_failures_keep_their_codes() -> None:
    reset = stream_failure(raised(httpx.RemoteProtocolError("sk-x")))
    assert (reset.code, reset.status) == ("upstream_reset", 502)
    assert (
        reset.message
        == "The upstream https://api.example.com:443 closed the connection in the middle of the answer."
    )
    timeout = stream_failure(raised(httpx.ReadTimeout("sk-x")))
    assert timeout.code == "upstream_timeout"
    assert timeout.message.endswith(
        "stopped sending in the middle of the answer for 600 s (upstream.timeout)."
    )
