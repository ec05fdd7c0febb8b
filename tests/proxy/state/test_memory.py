"""What the proxy keeps of a request while the upstream works, and giving freed memory back.

With a real model the upstream wait is seconds long and hundreds of requests can be in flight
per worker: during that wait the proxy must hold only what it sends, not the client's bytes,
their parsed copy or the client's messages (benchmarks/RESULTS.md, "Load")."""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from proxy import lifecycle
from proxy.app import create_app
from proxy.config.settings import load_settings
from proxy.state.memory import malloc_trim
from proxy.upstream.pool import Upstream

MARK = "retention-probe-"


def client_body() -> bytes:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Fix the test."},
    ]
    for i in range(50):
        call = {"id": f"{MARK}{i}", "type": "function", "function": {"name": "run", "arguments": "{}"}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"{MARK}{i}", "content": "x" * 20_000},
        ]
    return orjson.dumps({"model": "gpt-4o", "messages": messages})


def is_probe_call(message: dict[Any, Any]) -> bool:
    calls = message.get("tool_calls")
    return (
        isinstance(calls, list)
        and bool(calls)
        and isinstance(calls[0], dict)
        and str(calls[0].get("id")).startswith(MARK)
    )


@pytest.mark.parametrize(("known_prefix_tokens", "kept"), [(0, 0), (8 * 1024 * 1024, 50)])
async def test_the_client_body_and_its_parsed_copy_are_not_held_during_the_upstream_wait(
    tmp_path: Path, known_prefix_tokens: int, kept: int
) -> None:
    """Nothing of the request but the view, and the conversation's known prefix when it is on:
    one copy of each message (the first parse, whose texts the count cache holds anyway)."""
    size = len(client_body())
    seen: dict[str, Any] = {}

    async def upstream(request: httpx.Request) -> httpx.Response:
        gc.collect()
        # Client messages still alive anywhere: the parsed copy, or a policy outcome's reference.
        # (Assistant messages: gc does not track a dict that holds only strings.)
        seen["messages"] = sum(1 for o in gc.get_objects() if type(o) is dict and is_probe_call(o))
        # Full-size bytes held by a frame of this request (the test itself holds none).
        frame, held = sys._getframe(), []
        while frame is not None:
            held += [
                f"{frame.f_code.co_name}.{name}"
                for name, value in frame.f_locals.items()
                if isinstance(value, bytes | bytearray) and len(value) >= size
            ]
            frame = frame.f_back
        seen["bytes"], seen["sent"] = held, len(request.content)
        return httpx.Response(200, json={"choices": [{"message": {"role": "assistant", "content": "ok"}}]})

    settings = load_settings(
        env={},
        overrides={
            "state_dir": str(tmp_path),
            "policy": "n_latest_10",
            "upstream.http_client": "httpx",
            "sessions.known_prefix_tokens": known_prefix_tokens,
        },
    )
    app = create_app(settings, transport=httpx.MockTransport(upstream))

    async def chunks() -> AsyncIterator[bytes]:
        body = client_body()
        for start in range(0, len(body), 65_536):
            yield body[start : start + 65_536]

    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as client:
        response = await client.post("/v1/chat/completions", content=chunks())
    assert response.status_code == 200
    assert seen["sent"] < size / 2  # the view went out
    assert seen["bytes"] == []
    assert seen["messages"] == kept


@pytest.mark.parametrize("http_client", ["builtin", "aiohttp"])
async def test_the_sent_body_is_not_kept_with_the_upstream_response(http_client: str) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.lower().split(b"\r\n")
        length = next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length"))
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    overrides = {"upstream.base_url": f"http://127.0.0.1:{port}/v1", "upstream.http_client": http_client}
    upstream = Upstream(load_settings(env={}, overrides=overrides).upstream)
    try:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        response = await upstream.open("POST", url, [(b"content-type", b"application/json")], b"x" * 100_000)
        assert await response.aread() == b"ok"
        await response.aclose()
        # The response keeps no request (the one an error report names is made on failure).
        assert response._request is None
        assert response.stream.url == url  # type: ignore[attr-defined]
    finally:
        await upstream.aclose()
        server.close()
        await server.wait_closed()


def test_malloc_trim_is_found_on_glibc() -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc only")
    trim = malloc_trim()
    assert trim is not None
    assert trim() in (0, 1)


@pytest.mark.parametrize("every", [0.01, 0.0])
async def test_each_worker_trims_its_heap_on_the_configured_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, every: float
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(lifecycle, "malloc_trim", lambda: lambda: calls.append(1))
    settings = load_settings(
        env={}, overrides={"state_dir": str(tmp_path), "server.malloc_trim_seconds": every}
    )
    app = create_app(settings)
    async with app.control.lifespan():  # type: ignore[attr-defined]
        await asyncio.sleep(0.1)
    assert (len(calls) >= 3) if every else (calls == [])
