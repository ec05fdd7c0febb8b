"""A scriptable OpenAI-compatible upstream: a real HTTP server on loopback.

Tests queue replies (JSON, SSE streams, errors, hangs, resets) and read back every request
exactly as it arrived (method, path, query, headers, body bytes). It runs in a thread with
its own event loop, so it serves a proxy started as a subprocess as well as an in-process one.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web


@dataclass
class Recorded:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    raw_headers: list[tuple[bytes, bytes]]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class Reply:
    """One scripted answer. ``kind``: json, sse, hang, reset."""

    kind: str = "json"
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    chunks: list[Any] = field(default_factory=list)
    chunk_delay: float = 0.0
    done: bool = True
    reset_after: int | None = None
    delay: float = 0.0
    # Decide the reply from the request (e.g. read a handle the request contains).
    dynamic: Callable[[Recorded], Reply] | None = None


def completion(
    content: str = "ok", *, model: str = "fake-model", tool_calls: list[Any] | None = None
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
        message["content"] = None
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if tool_calls else "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
    }


def chunk(content: str | None = None, *, finish: str | None = None, role: bool = False) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = "assistant"
    if content is not None:
        delta["content"] = content
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "fake-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
    }


def text_stream(words: list[str]) -> list[Any]:
    return [chunk("", role=True), *(chunk(w) for w in words), chunk(None, finish="stop")]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class LoopbackServer:
    """An aiohttp handler served on a free loopback port from its own thread and event loop,
    so synchronous tests (and the real clients they drive) can talk to it."""

    def __init__(self, handler: Any, name: str) -> None:
        self.handler = handler
        self.name = name
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()

    def start(self) -> int:
        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            app = web.Application(client_max_size=1024**3)
            app.router.add_route("*", "/{tail:.*}", self.handler)
            runner = web.AppRunner(app, access_log=None, handle_signals=False)
            loop.run_until_complete(runner.setup())
            # Port 0: the kernel's free port, bound at once (a port chosen first could be
            # taken by a parallel test worker before it is bound).
            loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
            self.port = runner.addresses[0][1]
            self._started.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name=self.name, daemon=True)
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError(f"{self.name} did not start")
        return self.port

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)


class FakeUpstream:
    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        # The proxy's own questions about a model's window, answered as OpenAI's API does (a
        # models list without windows, 404 elsewhere), kept apart from the relayed requests.
        self.probes: list[str] = []
        self.replies: collections.deque[Reply] = collections.deque()
        self.port = 0
        self.cancelled_streams = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def queue(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    def reset(self) -> None:
        self.requests.clear()
        self.replies.clear()
        self.cancelled_streams = 0

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.headers.get("user-agent", "").startswith("compaction-proxy window-probe"):
            self.probes.append(f"{request.method} {request.path}")
            if request.path == "/v1/models":
                return web.json_response(
                    {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}
                )
            return web.json_response(
                {"error": {"message": "Not found", "type": "invalid_request_error"}}, status=404
            )
        self.requests.append(
            Recorded(
                method=request.method,
                path=request.path,
                query=request.rel_url.raw_query_string,
                headers={k.lower(): v for k, v in request.headers.items()},
                raw_headers=list(request.raw_headers),
                body=body,
            )
        )
        reply = self.replies.popleft() if self.replies else None
        while reply is not None and reply.dynamic is not None:
            reply = reply.dynamic(self.requests[-1])
        if reply is None:
            if request.path == "/v1/models":
                return web.json_response(
                    {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}
                )
            if request.path == "/v1/chat/completions":
                wants_stream = b'"stream":true' in body.replace(b" ", b"")
                reply = (
                    Reply(kind="sse", chunks=text_stream(["o", "k"]))
                    if wants_stream
                    else Reply(body=completion())
                )
            else:
                reply = Reply(
                    body={
                        "echo": {
                            "method": request.method,
                            "path": request.path,
                            "query": request.rel_url.raw_query_string,
                        }
                    }
                )
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.kind == "hang":
            await asyncio.sleep(3600)
        if reply.kind == "reset":
            assert request.transport is not None
            request.transport.abort()
            raise asyncio.CancelledError
        if reply.kind == "json":
            payload = reply.body if isinstance(reply.body, bytes) else orjson.dumps(reply.body)
            return web.Response(
                status=reply.status,
                body=payload,
                headers={"content-type": "application/json", **reply.headers},
            )
        response = web.StreamResponse(
            status=reply.status,
            headers={"content-type": "text/event-stream", "cache-control": "no-cache", **reply.headers},
        )
        await response.prepare(request)
        try:
            for index, item in enumerate(reply.chunks):
                if reply.reset_after is not None and index == reply.reset_after:
                    assert request.transport is not None
                    request.transport.abort()
                    return response
                data = item if isinstance(item, bytes) else b"data: " + orjson.dumps(item) + b"\n\n"
                await response.write(data)
                if reply.chunk_delay:
                    await asyncio.sleep(reply.chunk_delay)
            if reply.done:
                await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            self.cancelled_streams += 1
            raise
        return response

    def start(self) -> FakeUpstream:
        self._server = LoopbackServer(self._handle, "fake-upstream")
        self.port = self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def wait_for_requests(self, count: int, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.requests) < count and time.monotonic() < deadline:
            time.sleep(0.01)
