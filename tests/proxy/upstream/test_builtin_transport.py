"""The proxy's own HTTP/1.1 client against raw servers on 127.0.0.1 that answer byte for byte:
framing, keep-alive, the pool's limit, timeouts, failures and TLS."""

from __future__ import annotations

import asyncio
import gc
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.upstream.builtin_transport import BuiltinTransport
from tests.needs import service_binary

TIMEOUTS = {"connect": 2.0, "read": 2.0, "pool": 2.0, "write": 2.0}
OK = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-type: text/plain\r\n\r\nhello"
Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    """A listener that answers each request with ``answer`` and records what it received."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.ended = 0  # connections over (closed by either side)
        self.requests: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                self.requests.append(head + await reader.readexactly(length))
                await self.answer(reader, writer)
                if writer.is_closing():
                    return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client went away, or the test is over
        finally:
            self.ended += 1
            writer.close()


@asynccontextmanager
async def serving(answer: Answer, context: ssl.SSLContext | None = None) -> AsyncIterator[tuple[Server, int]]:
    server = Server(answer)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0, ssl=context)
    try:
        yield server, listener.sockets[0].getsockname()[1]
    finally:
        listener.close()


def reply(*parts: bytes, close: bool = False) -> Answer:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for part in parts:
            writer.write(part)
            await writer.drain()
        if close:
            writer.close()

    return answer


async def fetch(transport: BuiltinTransport, url: str, **kwargs: Any) -> tuple[httpx.Response, bytes]:
    response = await transport.send(
        kwargs.get("method", "POST"), url, kwargs.get("headers", []), kwargs.get("body", b"{}"), TIMEOUTS
    )
    body = b"".join([chunk async for chunk in response.stream])  # type: ignore[union-attr]
    await response.aclose()
    return response, body


@pytest.fixture
async def transport() -> AsyncIterator[BuiltinTransport]:
    client = BuiltinTransport(max_connections=8, keepalive_expiry=30.0)
    yield client
    await client.aclose()


async def test_a_request_goes_out_as_given_and_the_connection_is_kept(transport: BuiltinTransport) -> None:
    async with serving(reply(OK)) as (server, port):
        url = f"http://127.0.0.1:{port}/v1/chat/completions?api-version=2024-10-21&x=%2F"
        headers = [(b"authorization", b"Bearer sk-test"), (b"Host", b"evil"), (b"X-Trace", b"a")]
        for _ in range(3):
            response, body = await fetch(transport, url, headers=headers, body=b'{"a":1}')
            assert (response.status_code, body, response.headers["content-type"]) == (
                200,
                b"hello",
                "text/plain",
            )
    assert server.connections == 1
    assert server.requests[0] == (
        b"POST /v1/chat/completions?api-version=2024-10-21&x=%2F HTTP/1.1\r\n"
        + f"host: 127.0.0.1:{port}\r\n".encode()
        + b'authorization: Bearer sk-test\r\nX-Trace: a\r\ncontent-length: 7\r\n\r\n{"a":1}'
    )


@pytest.mark.parametrize(
    "answer",
    [
        [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"],
        [
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel",
            b"lo\r\n6\r\n world\r\n",
            b"0\r\n\r\n",
        ],
        [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\nhello world"],
    ],
    ids=["chunked", "chunked-in-pieces", "after-interim-100"],
)
async def test_framed_bodies_and_reuse(transport: BuiltinTransport, answer: list[bytes]) -> None:
    async with serving(reply(*answer)) as (server, port):
        for _ in range(2):
            _, body = await fetch(transport, f"http://127.0.0.1:{port}/")
            assert body == b"hello world"
    assert server.connections == 1


@pytest.mark.parametrize(
    "head", [b"HTTP/1.1 200 OK\r\n\r\n", b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n"]
)
async def test_a_body_that_ends_with_the_connection(transport: BuiltinTransport, head: bytes) -> None:
    async with serving(reply(head + b"all of it", close=True)) as (server, port):
        for _ in range(2):
            assert (await fetch(transport, f"http://127.0.0.1:{port}/"))[1] == b"all of it"
    assert server.connections == 2


async def test_bytes_after_the_answer_are_not_read_as_the_next_one(transport: BuiltinTransport) -> None:
    # A second answer in the same read as the first: the first is returned alone, and the
    # connection, out of step with its requests, is closed instead of reused.
    answer = reply(OK + b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nxx", OK)
    async with serving(answer) as (server, port):
        assert (await fetch(transport, f"http://127.0.0.1:{port}/"))[1] == b"hello"
        assert (await fetch(transport, f"http://127.0.0.1:{port}/"))[1] == b"hello"
    assert server.connections == 2


async def test_an_upgrade_answer_is_a_protocol_error(transport: BuiltinTransport) -> None:
    answer = reply(b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\n")
    async with serving(answer) as (_, port):
        with pytest.raises(httpx.RemoteProtocolError):
            await fetch(transport, f"http://127.0.0.1:{port}/")


async def test_idle_connections_a_server_closed_leave_room_for_other_upstreams() -> None:
    transport = BuiltinTransport(max_connections=8, keepalive_expiry=30.0, max_keepalive_connections=2)

    async def slow_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(0.05)
        writer.write(OK)
        await writer.drain()
        await asyncio.sleep(0.01)
        writer.close()  # after the answer, which did not say so: the client pools it first

    async with serving(slow_then_close) as (_, first), serving(reply(OK)) as (other, second):
        await asyncio.gather(*(fetch(transport, f"http://127.0.0.1:{first}/") for _ in range(2)))
        await asyncio.sleep(0.1)
        for _ in range(5):
            await fetch(transport, f"http://127.0.0.1:{second}/")
        assert other.connections == 1
        # Closing the transport closes what is idle, and what is in use once it is released.
        streaming = await transport.send("POST", f"http://127.0.0.1:{second}/", [], b"", TIMEOUTS)
        await transport.aclose()
        assert b"".join([chunk async for chunk in streaming.stream]) == b"hello"  # type: ignore[union-attr]
        await streaming.aclose()
        await asyncio.sleep(0.05)
        assert other.ended == 1


def test_the_host_header_leaves_out_a_default_port() -> None:
    transport = BuiltinTransport(max_connections=1, keepalive_expiry=30.0)
    assert transport._target("https://api.example.com:443/v1/x?a=1")[1:] == (b"/v1/x?a=1", b"api.example.com")
    assert transport._target("http://[::1]:8080/v1")[1:] == (b"/v1", b"[::1]:8080")


@pytest.mark.parametrize(
    ("first", "why"),
    [
        (OK.replace(b"OK\r\n", b"OK\r\nconnection: close\r\n"), "the server closes it"),
        (b"HTTP/1.0 200 OK\r\ncontent-length: 5\r\n\r\nhello", "HTTP/1.0 without keep-alive"),
    ],
)
async def test_a_connection_the_server_does_not_keep_is_not_reused(
    transport: BuiltinTransport, first: bytes, why: str
) -> None:
    async with serving(reply(first)) as (server, port):
        for _ in range(2):
            assert (await fetch(transport, f"http://127.0.0.1:{port}/"))[1] == b"hello", why
    assert server.connections == 2


async def test_an_unread_answer_closes_its_connection(transport: BuiltinTransport) -> None:
    big = b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n" + b"x" * 100_000
    async with serving(reply(big)) as (server, port):
        response = await transport.send("POST", f"http://127.0.0.1:{port}/", [], b"", TIMEOUTS)
        await response.aclose()
        assert (await fetch(transport, f"http://127.0.0.1:{port}/"))[1] == b"x" * 100_000
    assert server.connections == 2


async def test_a_head_request_has_no_body(transport: BuiltinTransport) -> None:
    async with serving(reply(OK.replace(b"\r\n\r\nhello", b"\r\n\r\n"))) as (_, port):
        response, body = await fetch(transport, f"http://127.0.0.1:{port}/", method="HEAD")
    assert (response.status_code, body) == (200, b"")


async def test_an_idle_connection_the_server_closed_is_replaced(transport: BuiltinTransport) -> None:
    async with serving(reply(OK, close=True)) as (server, port):
        # The answer says nothing of closing: the connection is pooled, then closed by the server.
        assert (await fetch(transport, f"http://127.0.0.1:{port}/"))[1] == b"hello"
        await asyncio.sleep(0.05)
        assert (await fetch(transport, f"http://127.0.0.1:{port}/"))[1] == b"hello"
    assert server.connections == 2


@pytest.mark.parametrize(
    ("expiry", "idle", "connections"), [(0.0, None, 3), (30.0, 0, 3), (30.0, 1, 1), (30.0, None, 1)]
)
async def test_idle_connections_kept_only_as_long_and_as_many_as_set(
    expiry: float, idle: int | None, connections: int
) -> None:
    transport = BuiltinTransport(max_connections=8, keepalive_expiry=expiry, max_keepalive_connections=idle)
    async with serving(reply(OK)) as (server, port):
        for _ in range(3):
            await fetch(transport, f"http://127.0.0.1:{port}/")
    await transport.aclose()
    assert server.connections == connections


async def test_a_large_answer_arrives_whole_while_the_reader_lags(transport: BuiltinTransport) -> None:
    payload = bytes(range(256)) * 20_000  # 5 MB: reading pauses past 1 MB unread
    answer = reply(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(payload), payload)
    async with serving(answer) as (_, port):
        response = await transport.send("POST", f"http://127.0.0.1:{port}/", [], b"", TIMEOUTS)
        received = bytearray()
        async for chunk in response.stream:  # type: ignore[union-attr]
            received += chunk
            await asyncio.sleep(0.001)
        await response.aclose()
    assert received == payload


async def never(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(30)


@pytest.mark.parametrize(
    ("answer", "error", "when"),
    [
        (reply(b"", close=True), httpx.RemoteProtocolError, "head"),
        (
            reply(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf", close=True),
            httpx.RemoteProtocolError,
            "body",
        ),
        (reply(b"HTTP/1.1 2x0 OK\r\n\r\n"), httpx.RemoteProtocolError, "head"),
        (reply(b"HTTP/1.1 200 OK\r\nx: " + b"y" * 300_000 + b"\r\n\r\n"), httpx.RemoteProtocolError, "head"),
        (never, httpx.ReadTimeout, "head"),
        (reply(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf", b""), httpx.ReadTimeout, "body"),
    ],
    ids=["closed-before-head", "closed-mid-body", "bad-status", "huge-head", "no-answer", "stalls-mid-body"],
)
async def test_failures_are_httpx_errors_that_name_their_request(
    answer: Answer, error: type[httpx.RequestError], when: str
) -> None:
    transport = BuiltinTransport(max_connections=1, keepalive_expiry=30.0)
    timeouts = {**TIMEOUTS, "read": 0.3}

    async def exchange(url: str) -> None:
        response = await transport.send("POST", url, [], b"{}", timeouts)
        assert when == "body"
        try:
            [chunk async for chunk in response.stream]  # type: ignore[union-attr]
        finally:
            await response.aclose()

    async with serving(answer) as (_, port):
        url = f"http://127.0.0.1:{port}/v1/x"
        with pytest.raises(error) as raised:
            await exchange(url)
        assert str(raised.value.request.url) == url
        assert raised.value.request.extensions["timeout"]["read"] == 0.3
        with pytest.raises(error):  # the pool's one place was given back
            await exchange(url)
    await transport.aclose()


async def test_connect_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    transport = BuiltinTransport(max_connections=1, keepalive_expiry=30.0)
    listener = await asyncio.start_server(never, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    listener.close()
    await listener.wait_closed()
    with pytest.raises(httpx.ConnectError) as refused:
        await transport.send("POST", f"http://127.0.0.1:{port}/", [], b"", TIMEOUTS)
    assert isinstance(refused.value.__cause__, ConnectionRefusedError)

    async def hangs(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(30)

    monkeypatch.setattr(asyncio.get_running_loop(), "create_connection", hangs)
    with pytest.raises(httpx.ConnectTimeout):
        await transport.send("POST", f"http://127.0.0.1:{port}/", [], b"", {**TIMEOUTS, "connect": 0.1})
    with pytest.raises(httpx.UnsupportedProtocol):
        await transport.send("POST", "ftp://127.0.0.1/", [], b"", TIMEOUTS)


async def test_the_pool_waits_for_a_free_place_then_times_out() -> None:
    transport = BuiltinTransport(max_connections=1, keepalive_expiry=30.0)
    async with serving(reply(OK)) as (server, port):
        url = f"http://127.0.0.1:{port}/"
        first = await transport.send("POST", url, [], b"", TIMEOUTS)
        waiting = asyncio.ensure_future(fetch(transport, url))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        assert b"".join([chunk async for chunk in first.stream]) == b"hello"  # type: ignore[union-attr]
        await first.aclose()
        assert (await waiting)[1] == b"hello"
        held = await transport.send("POST", url, [], b"", TIMEOUTS)
        with pytest.raises(httpx.PoolTimeout):
            await transport.send("POST", url, [], b"", {**TIMEOUTS, "pool": 0.1})
        # An answer dropped without being closed gives its place back when collected.
        del held
        gc.collect()
        assert (await fetch(transport, url))[1] == b"hello"
    await transport.aclose()
    assert server.connections == 2


def certificate(directory: Path) -> tuple[Path, ssl.SSLContext]:
    """A throwaway certificate for 127.0.0.1 (the openssl CLI), and a server context with it."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    arguments = (
        "req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1"
    )
    command = [service_binary("openssl"), *arguments.split(), "-keyout", str(key), "-out", str(cert)]
    subprocess.run(command, check=True, capture_output=True, timeout=60)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["http/1.1"])
    return cert, context


async def test_tls_with_a_certificate_the_system_trust_store_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, context = certificate(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # how a deployment adds its own CA
    transport = BuiltinTransport(max_connections=8, keepalive_expiry=30.0)
    async with serving(reply(OK), context) as (server, port):
        for _ in range(2):
            response, body = await fetch(transport, f"https://127.0.0.1:{port}/v1/models")
            assert (response.status_code, body) == (200, b"hello")
    await transport.aclose()
    assert server.connections == 1
