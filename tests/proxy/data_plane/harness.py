"""What the data-plane tests share: an in-memory store, a scripted upstream behind
``httpx.MockTransport`` (JSON bodies, or event streams cut at awkward byte boundaries, or
broken off), a client whose ASGI messages are captured through a ``ResponseWriter``, and
``drive``: one ``ReadLoop`` and its ``LoopDriver`` built as the proxy builds them, then run."""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from policies.tokens import TokenCounter
from proxy.config.settings import load_settings
from proxy.dialects.base import Dialect
from proxy.read_loop.commands import LoopLimits
from proxy.read_loop.driver import LoopDriver
from proxy.read_loop.loop import ReadLoop
from proxy.state.store import StoredOutput
from proxy.telemetry.exchange import LoopResult
from proxy.upstream.pool import Upstream
from proxy.wire.errors import ErrorBody, openai_error_body
from proxy.wire.response_writer import ResponseWriter

COUNTER = TokenCounter()
TENANT = "t_plane"
HANDLE = "out_00000000000000a1"
SAVED = "\n".join(f"log line {n}: ok" for n in range(1, 401))
URL = "http://upstream.test/v1/chat/completions"
REQUEST_ID = "req_plane"
SETTINGS = load_settings(env={}).upstream


class MemoryStore:
    """Saved outputs by tenant and handle, in memory; every read recorded."""

    def __init__(self, outputs: Mapping[str, str] | None = None, tenant: str = TENANT) -> None:
        saved = {HANDLE: SAVED} if outputs is None else outputs
        self.outputs = {(tenant, handle): content for handle, content in saved.items()}
        self.gets: list[str] = []

    async def get_output(self, tenant: str, handle: str) -> StoredOutput | None:
        self.gets.append(handle)
        content = self.outputs.get((tenant, handle))
        return None if content is None else StoredOutput(handle, content, "log")


@dataclass
class Reply:
    """One scripted upstream answer: a whole body (``chunks`` None) or an event stream in
    ``chunks``; ``fail_after``: the stream breaks (a reset connection) after that many chunks."""

    status: int = 200
    body: bytes = b""
    chunks: list[bytes] | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    fail_after: int | None = None


def json_reply(payload: Any, status: int = 200, headers: Sequence[tuple[str, str]] = ()) -> Reply:
    return Reply(status, orjson.dumps(payload), headers=[("content-type", "application/json"), *headers])


# Cut points that fall inside ``data:``, inside a JSON string, and between the two newlines of
# the blank line that ends an event.
AWKWARD = (7, 1, 33, 2, 120, 5)


def sse_reply(
    events: Sequence[bytes],
    sizes: Sequence[int] = AWKWARD,
    *,
    crlf: bool = False,
    fail_after: int | None = None,
) -> Reply:
    """``events`` as one byte stream cut into chunks of ``sizes`` bytes (cycled)."""
    raw = b"".join(events)
    if crlf:
        raw = raw.replace(b"\n", b"\r\n")
    return Reply(
        chunks=cut(raw, sizes), headers=[("content-type", "text/event-stream")], fail_after=fail_after
    )


def cut(raw: bytes, sizes: Sequence[int]) -> list[bytes]:
    chunks: list[bytes] = []
    start = 0
    while start < len(raw):
        size = sizes[len(chunks) % len(sizes)]
        chunks.append(raw[start : start + size])
        start += size
    return chunks


class ScriptedUpstream:
    """The upstream behind ``httpx.MockTransport``: each request recorded and answered by the
    next reply."""

    def __init__(self, replies: Sequence[Reply]) -> None:
        self.replies = collections.deque(replies)
        self.requests: list[httpx.Request] = []

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [orjson.loads(request.content) for request in self.requests]

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        reply = self.replies.popleft()
        if reply.chunks is None:
            return httpx.Response(reply.status, headers=reply.headers, content=reply.body)
        return httpx.Response(reply.status, headers=reply.headers, content=_stream(reply))


async def _stream(reply: Reply) -> AsyncIterator[bytes]:
    for count, chunk in enumerate(reply.chunks or []):
        if count == reply.fail_after:
            raise httpx.ReadError("Connection reset by peer")
        yield chunk


@dataclass
class Client:
    """The ASGI messages the client got."""

    messages: list[dict[str, Any]] = field(default_factory=list)

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    @property
    def start(self) -> dict[str, Any]:
        (start,) = [m for m in self.messages if m["type"] == "http.response.start"]
        return start

    @property
    def status(self) -> int:
        status: int = self.start["status"]
        return status

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.start["headers"])

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.response.body")

    @property
    def complete(self) -> bool:
        """The response ended once, with nothing after its end."""
        ends = [
            i for i, m in enumerate(self.messages) if m["type"] == "http.response.body" and not m["more_body"]
        ]
        return ends == [len(self.messages) - 1]

    def json(self) -> Any:
        return orjson.loads(self.body)

    def events(self) -> list[Any]:
        """The payloads of the event stream the client got (``[DONE]`` as the bytes it is)."""
        return sse_payloads(self.body)


def sse_payloads(raw: bytes) -> list[Any]:
    payloads: list[Any] = []
    for event in raw.split(b"\n\n"):
        data = b"".join(line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:"))
        if data:
            payloads.append(data if data == b"[DONE]" else orjson.loads(data))
    return payloads


@dataclass
class Run:
    result: LoopResult
    client: Client
    upstream: ScriptedUpstream
    store: MemoryStore
    loop: ReadLoop


async def drive(
    dialect: Dialect,
    body: dict[str, Any],
    replies: Sequence[Reply],
    *,
    store: MemoryStore | None = None,
    window: int = 128_000,
    reserve: int = 1024,
    requested: int = 0,
    limits: LoopLimits | None = None,
    error_body: ErrorBody = openai_error_body,
) -> Run:
    """``body`` (the read tool offered) through a ``LoopDriver`` against ``replies``."""
    upstream = ScriptedUpstream(replies)
    store = MemoryStore() if store is None else store
    client = Client()
    loop = ReadLoop(
        body,
        dialect=dialect,
        counter=COUNTER,
        window=window,
        reserve=reserve,
        limits=limits or LoopLimits(),
        requested=requested,
        handles=(HANDLE,),
    )
    writer = ResponseWriter(
        client.send,
        extra_headers=[(b"x-compaction-policy", b"plane")],
        error_event=dialect.error_event,
        error_body=error_body,
    )
    driver = LoopDriver(
        loop,
        upstream=Upstream(SETTINGS, transport=httpx.MockTransport(upstream.handle)),
        store=store,  # type: ignore[arg-type]
        url=URL,
        headers=[(b"content-type", b"application/json"), (b"accept-encoding", b"gzip, br")],
        tenant=TENANT,
        writer=writer,
        request_id=REQUEST_ID,
    )
    result = await driver.run()
    assert not upstream.replies, "a scripted reply was never asked for"
    return Run(result, client, upstream, store, loop)
