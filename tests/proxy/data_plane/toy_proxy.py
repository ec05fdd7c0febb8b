"""The compacting route with a door the proxy does not ship (``toy_dialect.ToyDialect``), built
as ``proxy/app.py`` builds the graph (``AppParts.build``: settings, policies from the settings,
the compaction service, a real ``SQLiteStore`` in a temporary directory, the upstream behind
``httpx.MockTransport``), the route made by ``make_route`` with the toy door as its only dialect.
A request goes through ``route.handle`` with a capturing ``send``; a ``ProxyError`` the route
raises is answered as the edge answers it, in the provider's error shape.

The histories are a coding agent's: a task, then shell calls with ids, each answered by a
long pytest log."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import structlog

from policies.tokens import TokenCounter
from proxy.config.settings import Settings, load_settings
from proxy.dialects.base import Dialect
from proxy.parts import AppParts, make_route
from proxy.route.steps import CompactingRoute
from proxy.state.sqlite_store import SQLiteStore
from proxy.state.store import Store
from proxy.telemetry.exchange import Exchange
from proxy.upstream.providers import Provider, make_providers
from proxy.wire.errors import ProxyError
from proxy.wire.response_writer import ResponseWriter
from tests.proxy.data_plane.harness import Client, Reply, json_reply
from tests.proxy.data_plane.toy_dialect import ToyDialect

COUNTER = TokenCounter()
BASE = "http://upstream.test/v1"
PATH = b"/v1/toy/answer"
KEY = "sk-toy-tenant-0000000000"
MODEL = "toy-1"
# Six logs (33,000 tokens) are a compaction point of `improved` here: five offloaded, handles named.
WINDOW = 16384
SYSTEM = "You are a coding agent working in /workspace/tidetime. Use the tools; be brief."
TASK = "tests/test_parse.py::test_offsets fails on main. Find out why and fix it."
BASH = {
    "name": "execute_bash",
    "about": "Run a shell command in the sandbox.",
    "params": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}


def pytest_log(step: int, lines: int = 300) -> str:
    out = [f"tests/test_parse.py::test_case_{step}_{n} PASSED [{n * 100 // lines:3d}%]" for n in range(lines)]
    out[lines // 2] = f"tests/test_parse.py::test_offsets FAILED offset={4200 + step} expected=42"
    return "\n".join([f"$ pytest -k case_{step}", *out, f"=== 1 failed, {lines - 1} passed ==="])


def turns(steps: int) -> list[dict[str, Any]]:
    """The task, then ``steps`` shell calls each answered by its log (every turn stamped ``ts``)."""
    history: list[dict[str, Any]] = [{"who": "user", "say": TASK, "ts": 0}]
    for i in range(steps):
        call_id = f"call_{i:02d}"
        command = f"cd /workspace/tidetime && python -m pytest tests/test_parse.py -k case_{i}"
        history += [
            {
                "who": "agent",
                "say": None,
                "act": [{"id": call_id, "tool": "execute_bash", "args": {"command": command}}],
                "ts": 2 * i + 1,
            },
            {"who": "tool", "re": call_id, "say": pytest_log(i), "ts": 2 * i + 2},
        ]
    return history


def body(steps: int = 6, **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "system": SYSTEM, "turns": turns(steps), "tools": [BASH], "limit": 512, **fields}


def answer(say: str | None = "Done.", acts: Sequence[dict[str, Any]] = (), prompt: int = 100) -> Reply:
    turn = {"who": "agent", "say": say, "act": list(acts)}
    return json_reply(
        {"id": "toy_answer", "turn": turn, "usage": {"in": prompt, "out": 7, "all": prompt + 7}}
    )


HANDLE = re.compile(rb"handle=(out_[0-9a-f]+)")
# An upstream reply, or one made from the request it answers (to read a handle the view names).
Scripted = Reply | Callable[[httpx.Request], Reply]


def handles_in(request: httpx.Request) -> list[str]:
    return [m.decode() for m in HANDLE.findall(request.content)]


class ToyUpstream:
    """The upstream behind ``httpx.MockTransport``: each request recorded and answered by the
    next scripted reply."""

    def __init__(self) -> None:
        self.replies: collections.deque[Scripted] = collections.deque()
        self.requests: list[httpx.Request] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        reply = self.replies.popleft()
        if callable(reply):
            reply = reply(request)
        if reply.chunks is None:
            return httpx.Response(reply.status, headers=reply.headers, content=reply.body)
        return httpx.Response(reply.status, headers=reply.headers, content=_chunks(reply.chunks))


async def _chunks(chunks: Sequence[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def reads_first_handle(request: httpx.Request) -> Reply:
    """The model reads the first saved output its request names."""
    return answer(None, [read_act(handles_in(request)[0])], prompt=900)


def read_act(handle: str, call_id: str = "call_read") -> dict[str, Any]:
    return {"id": call_id, "tool": "read_tool_output", "args": {"handle": handle, "pattern": "FAILED"}}


@dataclass
class Served:
    """One request: what the client got, the request's record, what the upstream received."""

    client: Client
    exchange: Exchange
    requests: list[httpx.Request]

    @property
    def sent(self) -> list[dict[str, Any]]:
        return [orjson.loads(request.content) for request in self.requests]

    def header(self, name: str) -> str | None:
        value = self.client.headers.get(name.encode())
        return None if value is None else value.decode()


@dataclass
class ToyProxy:
    settings: Settings
    parts: AppParts
    route: CompactingRoute
    dialect: Dialect
    upstream: ToyUpstream
    provider: Provider

    async def request(
        self,
        content: dict[str, Any] | bytes,
        replies: Sequence[Scripted] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Served:
        raw = content if isinstance(content, bytes) else orjson.dumps(content)
        self.upstream.replies.extend([answer()] if replies is None else replies)
        before = len(self.upstream.requests)
        exchange = Exchange(
            request_id="cpx-toy", route=self.dialect.name, method="POST", started=time.perf_counter()
        )
        client_headers = [
            (b"content-type", b"application/json"),
            (b"authorization", f"Bearer {KEY}".encode()),
            *((k.lower().encode(), v.encode()) for k, v in (headers or {}).items()),
        ]
        url = self.provider.base.url(PATH, b"")
        draft = self.route.draft(self.dialect.name, client_headers, raw, url, exchange, self.provider)
        client = Client()
        try:
            await self.route.handle(client.send, draft)
        except ProxyError as error:  # as the edge answers it
            writer = ResponseWriter(
                client.send, extra_headers=exchange.extra_headers, error_body=self.provider.error_body
            )
            await writer.fail(error)
            exchange.status = error.status
        assert not self.upstream.replies, "a scripted reply was never asked for"
        return Served(client, exchange, self.upstream.requests[before:])


def toy_settings(tmp_path: Path, **overrides: Any) -> Settings:
    return load_settings(
        env={},
        overrides={
            "state_dir": str(tmp_path),
            "upstream.base_url": BASE,
            "policy": "improved",
            "context_windows": {"default": WINDOW},
            **overrides,
        },
    )


@contextlib.asynccontextmanager
async def toy_proxy(
    tmp_path: Path,
    dialect: Dialect | None = None,
    *,
    store: Store | None = None,
    anthropic: bool = False,
    **overrides: Any,
) -> AsyncIterator[ToyProxy]:
    """The graph of ``proxy/app.py`` with the toy door; ``overrides``: dotted settings."""
    settings = toy_settings(tmp_path, **overrides)
    upstream = ToyUpstream()
    parts = AppParts.build(
        settings,
        log=structlog.get_logger("toy"),
        transport=httpx.MockTransport(upstream.handle),
        counter=COUNTER,
        summarizer_transport=None,
        store=store or SQLiteStore(tmp_path / "toy.db"),
    )
    door: Dialect = dialect or ToyDialect()
    route = make_route(
        settings, parts.policies, {door.name: door}, parts.service, parts.route.loops, parts.shadow
    )
    providers = make_providers(settings)
    provider = providers.anthropic if anthropic else providers.openai
    try:
        yield ToyProxy(settings, parts, route, door, upstream, provider)
    finally:
        await asyncio.gather(*parts.service.background, *parts.events.pending)
        await parts.upstream.aclose()
        await parts.store.close()
