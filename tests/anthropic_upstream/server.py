"""``AnthropicUpstream``: the fake Messages API server (see the package docstring)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable
from typing import Any, Literal

import orjson
from aiohttp import web

from tests.anthropic_upstream import protocol, wire
from tests.anthropic_upstream.agent import (
    Conversation,
    Plan,
    ScriptedAgent,
    offers_read,
    run_key,
    thinking_on,
)
from tests.anthropic_upstream.errors import (
    Failure,
    b58,
    base_headers,
    error_body,
    prompt_too_long,
    request_id,
    too_many_breakpoints,
)
from tests.anthropic_upstream.protocol import Emitted
from tests.anthropic_upstream.record import Recorder, Seen
from tests.anthropic_upstream.tokens import MAX_BREAKPOINTS, ClaudeTokenizer, breakpoints, cache_usage
from tests.fake_upstream import LoopbackServer


def _numbers(value: int | Iterable[int] | None) -> frozenset[int]:
    if value is None:
        return frozenset()
    return frozenset([value]) if isinstance(value, int) else frozenset(value)


class AnthropicUpstream(Recorder):
    """The fake Anthropic Messages API. Options:

    ``window``: the context window (a request whose prompt plus ``max_tokens`` exceeds it gets
    the real 400). ``steps``: client tool steps before the final answer. ``read_every``: read a
    saved output (when ``read_tool_output`` is offered and a handle named) once at least this
    many steps passed since the last read; 0 never reads. ``read_arguments``: read arguments in
    turn (the handle is added). ``read_preamble``: a text block before a read's tool_use.
    ``mixed``: a read answer also calls the client's tool, ``"after"`` or ``"before"`` the read
    (``mixed_calls`` records their ids). ``fail_request`` / ``fail_read_follow_up``: fail the
    N-th ``/v1/messages`` request / read follow-up round (1-based over the server's life; an int
    or several) as ``failure`` says. ``output_lines``: lines each step's command prints.
    ``strict``: refuse protocol and thinking problems with the real 400 (else record and answer).
    ``tool``: the client tool to call (default ``Bash``, else the first custom tool).
    ``step_text``: a text block before each step's tool_use. ``redacted_thinking``: answers also
    carry a ``redacted_thinking`` block. ``file_template``: ``file_path`` of a ``Read`` step
    (``{step}`` formatted). ``factor``: the tokenizer's factor over o200k. ``cache_min_tokens``:
    the shortest cacheable prefix. ``api_key``: when set, a request with another key (in
    ``x-api-key`` or ``Authorization: Bearer``) gets the real 401 (recorded, kind ``unauthorized``).
    ``model``: the ``model`` answered (default: the request's)."""

    def __init__(
        self,
        *,
        window: int = 200_000,
        steps: int = 30,
        read_every: int = 1,
        read_arguments: list[dict[str, Any]] | None = None,
        read_preamble: str | None = None,
        mixed: Literal["after", "before"] | None = None,
        fail_request: int | Iterable[int] | None = None,
        fail_read_follow_up: int | Iterable[int] | None = None,
        failure: Failure | None = None,
        output_lines: int = 90,
        strict: bool = False,
        tool: str | None = None,
        step_text: bool = True,
        redacted_thinking: bool = False,
        file_template: str | None = None,
        factor: float = 1.2,
        cache_min_tokens: int = 1024,
        api_key: str | None = None,
        model: str | None = None,
    ) -> None:
        self.window = window
        self.strict = strict
        self.fail_request = _numbers(fail_request)
        self.fail_read_follow_up = _numbers(fail_read_follow_up)
        self.failure = failure or Failure()
        self.cache_min_tokens = cache_min_tokens
        self.api_key = api_key
        self.model = model
        self.agent = ScriptedAgent(
            steps=steps,
            read_every=read_every,
            read_arguments=read_arguments or [{"pattern": "ERROR"}, {"num_lines": 40}],
            read_preamble=read_preamble,
            mixed=mixed,
            output_lines=output_lines,
            tool=tool,
            step_text=step_text,
            redacted_thinking=redacted_thinking,
            file_template=file_template,
        )
        self.tokenizer = ClaudeTokenizer(factor)
        self.requests: list[Seen] = []
        self.count_requests: list[tuple[dict[str, Any], int]] = []  # (body, input_tokens) of count_tokens
        self.others: list[tuple[str, str, dict[str, str]]] = []  # (method, path, headers) of other routes
        self.conversations: dict[str, Conversation] = {}
        self.emitted: dict[str, Emitted] = {}  # signature (redacted data) -> what was emitted
        self.read_calls: set[str] = set()  # ids of the read_tool_output tool_uses emitted
        self.mixed_calls: set[str] = set()  # ids of client tool_uses emitted beside a read
        self.read_follow_ups = 0
        self.failures_injected = 0
        self.port = 0
        self._lock = threading.Lock()

    # ----- what tests read back -----

    @property
    def steps(self) -> int:
        return self.agent.steps

    @property
    def base_url(self) -> str:
        """For the ``anthropic`` SDK and ``ANTHROPIC_BASE_URL`` (no ``/v1``: they add it)."""
        return f"http://127.0.0.1:{self.port}"

    def count(self, body: dict[str, Any]) -> int:
        """The fake's input-token count of a request body (what ``count_tokens`` answers)."""
        return self.tokenizer.count(body)

    # ----- the decision -----

    def _decide(self, body: dict[str, Any], headers: dict[str, str], path: str) -> tuple[Seen, Any]:
        """The record of a request and its answer: a ``Plan``, a ``Failure`` or (status, message)."""
        raw_messages = body.get("messages")
        messages: list[Any] = raw_messages if isinstance(raw_messages, list) else []
        tools = body.get("tools")
        thinking = thinking_on(body)
        segments = self.tokenizer.segments(body)
        tokens = self.tokenizer.count(body)
        max_tokens = body.get("max_tokens")
        limit = max_tokens if isinstance(max_tokens, int) else 0
        follow_up = protocol.is_read_follow_up(messages, self.read_calls)
        problems, merged = protocol.protocol_problems(messages, thinking)
        seen = Seen(
            index=len(self.requests),
            conversation=run_key(body, headers),
            path=path,
            tokens=tokens,
            max_tokens=limit,
            budget=tokens + limit,
            stream=body.get("stream") is True,
            thinking=thinking,
            kind="",
            step=0,
            offered_read=offers_read(tools),
            read_follow_up=follow_up,
            handles=protocol.handles(body),
            problems=problems,
            thinking_problems=protocol.thinking_problems(messages, self.emitted),
            leaks=protocol.leaks(messages, follow_up, self.read_calls),
            merged=merged,
            cache_breakpoints=breakpoints(segments),
            tool_names=[str(t.get("name")) for t in tools if isinstance(t, dict)]
            if isinstance(tools, list)
            else [],
            body=body,
            headers=headers,
            at=time.monotonic(),
        )
        conv = self.conversations.get(seen.conversation) or Conversation(seen.conversation)
        seen.step = conv.step
        if self.api_key is not None and self.api_key not in (
            headers.get("x-api-key"),
            headers.get("authorization", "").removeprefix("Bearer "),
        ):
            return self._refuse(seen, "unauthorized", "invalid x-api-key", status=401)
        if not isinstance(raw_messages, list):
            return self._refuse(seen, "invalid", "messages: Field required")
        if not isinstance(max_tokens, int):
            return self._refuse(seen, "invalid", "max_tokens: Field required")
        thinking_error = protocol.thinking_budget_error(body, headers)
        if thinking_error:
            return self._refuse(seen, "invalid", thinking_error)
        if len(seen.cache_breakpoints) > MAX_BREAKPOINTS:
            return self._refuse(seen, "invalid", too_many_breakpoints(len(seen.cache_breakpoints)))
        if seen.budget > self.window:
            return self._refuse(seen, "rejected", prompt_too_long(tokens, limit, self.window))
        if self.strict and (seen.problems or seen.thinking_problems):
            return self._refuse(
                seen, "invalid", protocol.real_message([*seen.problems, *seen.thinking_problems][0])
            )
        if follow_up:
            self.read_follow_ups += 1
        plan = self.agent.plan(
            conv, body, follow_up=follow_up, handles=seen.handles, offered_read=seen.offered_read
        )
        if len(self.requests) + 1 in self.fail_request or (
            follow_up and self.read_follow_ups in self.fail_read_follow_up
        ):
            self.failures_injected += 1
            seen.kind, seen.content = "failed", plan.content
            seen.status = (
                self.failure.status
                if self.failure.kind == "status"
                else 529
                if self.failure.kind == "stream_error" and not seen.stream
                else 200
            )
            return seen, self.failure
        usage = cache_usage(segments, conv.cache, self.cache_min_tokens)
        seen.cache_read, seen.cache_creation = usage.read, usage.creation
        plan.after.cache = conv.cache | usage.entries
        self._commit(plan)
        seen.kind, seen.step, seen.content = plan.kind, plan.after.step, plan.content
        return seen, plan

    @staticmethod
    def _refuse(seen: Seen, kind: str, message: str, status: int = 400) -> tuple[Seen, Any]:
        seen.kind, seen.status, seen.error = kind, status, message
        return seen, (status, message)

    def _commit(self, plan: Plan) -> None:
        self.conversations[plan.after.key] = plan.after
        self.read_calls |= plan.read_ids
        self.mixed_calls |= plan.mixed_ids
        message = tuple(protocol.canonical(b) for b in plan.content)
        for block in plan.content:
            if block["type"] == "thinking":
                self.emitted[block["signature"]] = Emitted(block["thinking"], message)
            elif block["type"] == "redacted_thinking":
                self.emitted[block["data"]] = Emitted(block["data"], message)

    # ----- the wire -----

    def _usage(self, seen: Seen, content: list[dict[str, Any]]) -> dict[str, Any]:
        return wire.usage(
            seen.input_tokens, seen.cache_read, seen.cache_creation, self.tokenizer.output(content)
        )

    async def _messages(self, request: web.Request, headers: dict[str, str]) -> web.StreamResponse:
        raw = await request.read()
        rid = request_id("invalid", len(self.requests), raw[:64])
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            message = (
                "There was an issue with the format or content of your request: the body is not valid JSON."
            )
            return self._json(400, error_body(400, message, rid=rid), rid)
        if not isinstance(body, dict):
            return self._json(400, error_body(400, "Input should be a valid dictionary", rid=rid), rid)
        with self._lock:
            seen, answer = self._decide(body, headers, request.path_qs)
            self.requests.append(seen)
        rid = request_id(seen.index, seen.conversation)
        if isinstance(answer, tuple):
            status, message = answer
            return self._json(status, error_body(status, message, rid=rid), rid)
        message_id = "msg_01" + b58("message", seen.index, seen.conversation)
        model = self.model or str(body.get("model") or "claude-sonnet-4-5")
        content = seen.content
        if isinstance(answer, Failure):
            return await self._fail(
                request,
                seen,
                answer,
                wire.events(message_id, model, content, self._usage(seen, content)),
                rid,
            )
        use = self._usage(seen, content)
        if not seen.stream:
            return self._json(200, wire.message(message_id, model, content, use), rid)
        response = web.StreamResponse(status=200, headers=self._sse_headers(rid))
        await response.prepare(request)
        for data in wire.events(message_id, model, content, use):
            await response.write(data)
        await response.write_eof()
        return response

    async def _fail(
        self, request: web.Request, seen: Seen, failure: Failure, events: list[bytes], rid: str
    ) -> web.StreamResponse:
        if failure.kind == "status" or (failure.kind == "stream_error" and not seen.stream):
            status = failure.status if failure.kind == "status" else 529
            seen.error = str(failure.body(rid)["error"]["message"])
            return self._json(status, failure.body(rid), rid, failure.headers())
        if failure.kind == "reset" and not seen.stream:
            assert request.transport is not None
            request.transport.abort()
            raise asyncio.CancelledError
        response = web.StreamResponse(status=200, headers=self._sse_headers(rid))
        await response.prepare(request)
        for data in events[: failure.after_events]:
            await response.write(data)
        if failure.kind == "stream_error":
            seen.error = "Overloaded"
            await response.write(wire.error_event(failure.body(rid)))
            await response.write_eof()
            return response
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.abort()
        return response

    @staticmethod
    def _sse_headers(rid: str) -> dict[str, str]:
        return {
            **base_headers(rid),
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-cache",
        }

    @staticmethod
    def _json(status: int, body: Any, rid: str, extra: dict[str, str] | None = None) -> web.Response:
        return web.json_response(
            body,
            status=status,
            headers={**base_headers(rid), **(extra or {})},
            dumps=lambda v: orjson.dumps(v).decode(),
        )

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        headers = {k.lower(): v for k, v in request.headers.items()}
        path = request.path.rstrip("/") or "/"
        if path == "/v1/messages" and request.method == "POST":
            return await self._messages(request, headers)
        rid = request_id("other", len(self.others), request.path)
        if path == "/v1/messages/count_tokens" and request.method == "POST":
            try:
                body = orjson.loads(await request.read())
            except orjson.JSONDecodeError:
                body = None
            if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
                return self._json(400, error_body(400, "messages: Field required", rid=rid), rid)
            tokens = self.count(body)
            with self._lock:
                self.count_requests.append((body, tokens))
            return self._json(200, {"input_tokens": tokens}, rid)
        with self._lock:
            self.others.append((request.method, request.path_qs, headers))
        if path == "/" and request.method in ("HEAD", "GET"):
            # Claude Code probes the base URL before its first request: any answer will do.
            return web.Response(
                status=200, text="" if request.method == "HEAD" else "ok", headers=base_headers(rid)
            )
        return self._json(404, error_body(404, rid=rid), rid)

    # ----- life -----

    def start(self) -> AnthropicUpstream:
        self.tokenizer.warm_up()

        self._server = LoopbackServer(self._handle, "anthropic-upstream")
        self.port = self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> AnthropicUpstream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
