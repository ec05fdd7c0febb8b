"""The ``/v1`` edge: chat completions through the policy pipeline, everything else verbatim.

These are raw ASGI handlers on purpose. A proxy must relay bytes and stream chunks as they
arrive, see a client disconnect, and never re-encode what it does not change; a framework
request/response cycle would get in the way of all four and cost time on every request.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import orjson
import structlog

from policies.conversation import shape_problem
from policies.digests import Digests
from policies.handles import names_a_handle
from policies.pipeline import Checkpoint, Policy, PolicyOutcome, requested_answer_tokens
from policies.tokens import TokenCounter
from policies.windows import ContextWindows
from proxy.errors import ProxyError
from proxy.events import EventSink, build_event, config_hash
from proxy.forwarding import (
    UnsafePath,
    UpstreamBase,
    client_response_headers,
    header_value,
    upstream_request_headers,
)
from proxy.large_requests import LargeRequests, LargeWorker
from proxy.metrics import Metrics
from proxy.read_tool import ReadLimits, tool_schema
from proxy.response_writer import ResponseWriter
from proxy.session_index import BranchIndex, Resolution
from proxy.sessions import (
    MemorySessions,
    bearer_key,
    credentials,
    explicit_session,
    root_session,
    tenant_of,
)
from proxy.settings import Settings, policy_specs
from proxy.shadow import ShadowComparer
from proxy.store import Store
from proxy.summarizer import OpenAISummarizer
from proxy.tool_loop import LoopDriver, LoopLimits, LoopResult, ReadLoop, answer_reserve
from proxy.upstream import Upstream, failure_kind, upstream_failure

Scope = Mapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

CHAT_PATH = b"/v1/chat/completions"
_MODES = ("enforce", "shadow", "off")
_SSE = b"text/event-stream"
# Bytes of a real answer kept for a shadow comparison.
_CAPTURE_LIMIT = 16 * 1024 * 1024


class ClientDisconnected(Exception):
    """The client went away; nothing more can be sent to it."""


@dataclass(slots=True)
class Exchange:
    """Facts about one proxied request, gathered for the log line and the metrics."""

    request_id: str
    route: str
    method: str
    started: float
    status: int = 0
    upstream_seconds: float = 0.0
    policy: str = "-"
    mode: str = "-"
    stream: bool = False
    tokens_before: int | None = None
    tokens_after: int | None = None
    error: str | None = None
    read_rounds: int = 0
    mechanisms: tuple[str, ...] = ()
    trigger: str | None = None
    checkpoint_dropped: bool = False
    # Why the policy was not applied (a malformed history, a body only a lenient parser reads).
    skipped: str | None = None
    # A request that forked a new session from another one (parent, messages shared, inherited).
    session_fork: dict[str, Any] | None = None
    # For the compaction event, recorded once the response is out.
    outcome: PolicyOutcome | None = None
    tenant: str = ""
    session: str = ""
    model: object = None
    messages_before: int = 0
    messages_after: int = 0
    offloaded_bytes: int = 0
    reads: LoopResult | None = None
    # Shadow comparison of this request: the compacted body, and the real answer's bytes.
    compare_body: dict[str, Any] | None = None
    compare_url: str = ""
    compare_headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    captured: bytearray | None = None
    captured_sse: bool = False
    # Set just before the last body message: from then on a disconnect is the normal end.
    responded: bool = False
    extra_headers: list[tuple[bytes, bytes]] = field(default_factory=list)

    def mark_responded(self) -> None:
        self.responded = True


@dataclass(slots=True)
class Outgoing:
    """A chat request as it goes upstream. Only this is kept while the upstream works (seconds
    for a model): the client's bytes and their parsed copy are released before that wait."""

    chat_headers: list[tuple[bytes, bytes]]
    # The bytes to send: the client's own, or the re-encoded view.
    content: bytes = b""
    # The view names saved outputs: its body for the read_tool_output loop (resent each round).
    loop_body: dict[str, Any] | None = None
    tenant: str = ""
    window: int = 0
    reserve: int = 0

    def take_content(self) -> bytes:
        """The bytes to send, handed over: the sender drops them once they are sent."""
        content, self.content = self.content, b""
        return content


def _kept_for_event(outcome: PolicyOutcome) -> PolicyOutcome:
    """The outcome as the compaction event needs it once the request is forwarded: without the
    client's messages or the offloaded texts, and without the view unless this request is a
    compaction point (whose event holds the view itself)."""
    return replace(
        outcome,
        messages=outcome.messages if outcome.trigger else None,
        original=(),
        offloads={handle: replace(o, content="") for handle, o in outcome.offloads.items()},
    )


def _policy_reserve(policy: Policy) -> int:
    """The answer reserve the policy's token safeguard keeps (1024 without one)."""
    for stage in policy.stages:
        if stage.name == "token_safeguard":
            return int(getattr(stage, "reserve_tokens", 1024))
    return 1024


def _status_class(status: int) -> str:
    return f"{status // 100}xx" if status else "none"


def _new_request_id() -> str:
    return "cpx-" + os.urandom(12).hex()


def _package_version() -> str:
    try:
        return importlib.metadata.version("compaction-proxy")
    except importlib.metadata.PackageNotFoundError:
        return "0"


def _lenient_int(digits: str) -> int | str:
    """An integer as Python reads it; past Python's 4,300-digit limit, its digits (the body
    is forwarded as sent, so the value itself is never needed)."""
    return int(digits) if len(digits) <= 4000 else digits


def _parse_json(body: bytes) -> tuple[Any, bool]:
    """The parsed body, and whether only Python's lenient parser could read it."""
    try:
        return orjson.loads(body), False
    except orjson.JSONDecodeError:
        # orjson refuses integers beyond 64 bits, NaN and lone surrogate escapes, which
        # Python's parser reads; such a request is still forwarded, but as the client sent it.
        try:
            return json.loads(body, parse_int=_lenient_int), True
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise ProxyError(400, "We could not parse the JSON body of your request.") from exc


class ProxyHandler:
    """Dispatches every ``/v1/*`` request that no admin route claimed."""

    def __init__(
        self,
        settings: Settings,
        upstream: Upstream,
        counter: TokenCounter,
        policies: Mapping[str, Policy],
        metrics: Metrics,
        logger: Any = None,
        sessions: MemorySessions | None = None,
        summarizer: OpenAISummarizer | None = None,
        *,
        store: Store,
    ) -> None:
        self.settings = settings
        self.upstream = upstream
        self.counter = counter
        self.policies = policies
        self.metrics = metrics
        # Bound once: a lazy proxy logger would resolve its configuration on every call.
        self.log = (logger or structlog.get_logger("compaction_proxy")).bind()
        self._base_url = settings.upstream.base_url
        self._upstream_base = UpstreamBase(settings.upstream.base_url)
        # Clients without a credential would spend the configured key as one shared tenant.
        self._refuse_anonymous = bool(settings.upstream.api_key) and not settings.server.allow_anonymous
        self._api_key = settings.upstream.api_key
        self._max_body = settings.server.max_body_bytes
        self._valid_policies = ", ".join(sorted(policies))
        self.windows = ContextWindows(settings.context_windows)
        self.sessions = sessions or MemorySessions(settings.sessions.max_sessions)
        self.branches = BranchIndex(settings.sessions.max_sessions)
        self.large = LargeRequests(settings)
        self.summarizer = summarizer
        self.digests = Digests(counter=counter)
        self.store = store
        reads = settings.read_tool
        self.loop_limits = LoopLimits(
            max_rounds=reads.max_rounds,
            max_calls_per_answer=reads.max_calls_per_answer,
            max_total_bytes=reads.max_total_bytes,
            read=ReadLimits(
                max_lines=reads.max_lines,
                max_line_chars=reads.max_line_chars,
                max_result_bytes=reads.max_result_bytes,
                max_result_tokens=reads.max_result_tokens,
            ),
            timeout_seconds=reads.timeout_seconds,
        )
        self._read_schema = tool_schema(reads.max_lines)
        self.events = EventSink(store, settings.events.jsonl_path, self.log)
        self._pid = os.getpid()
        shadow = settings.shadow
        self.shadow = ShadowComparer(
            sample_rate=shadow.sample_rate if shadow.compare else 0.0,
            max_concurrent=shadow.max_concurrent,
        )
        package_version = _package_version()
        self._policy_meta = {
            name: (package_version, config_hash(spec)) for name, spec in policy_specs(settings).items()
        }
        self.background: set[asyncio.Task[None]] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
        raw_path = raw_path.split(b"?", 1)[0]
        is_chat = raw_path == CHAT_PATH and scope["method"] == "POST"
        exchange = Exchange(
            request_id=_new_request_id(),
            route="chat" if is_chat else "passthrough",
            method=scope["method"],
            started=time.perf_counter(),
        )
        exchange.extra_headers.append((b"x-compaction-request-id", exchange.request_id.encode()))
        current = asyncio.current_task()

        async def watch_disconnect() -> None:
            # After the body is read, the next ASGI message is the disconnect; cancelling the
            # relay closes the upstream connection, so the upstream stops generating too.
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    if not exchange.responded and current is not None:
                        exchange.error = "client_disconnected"
                        current.cancel()
                    return

        watcher: asyncio.Task[None] | None = None
        try:
            if self._refuse_anonymous and not credentials(scope["headers"]):
                raise ProxyError(
                    401,
                    "You didn't provide an API key. Send it in an Authorization header "
                    "(Authorization: Bearer YOUR_KEY), or an api-key or x-api-key header.",
                    code="missing_api_key",
                )
            try:
                url = self._upstream_base.url(raw_path, scope.get("query_string", b""))
            except UnsafePath:
                raise ProxyError(400, "The request path is not allowed.", code="invalid_path") from None
            body = await self._read_body(scope, receive)
            watcher = asyncio.create_task(watch_disconnect())
            if is_chat:
                outgoing = await self._prepare_chat(scope, body, url, exchange)
                # Not kept while the upstream works: with many requests in flight, their
                # bodies would add up (the parsed copy is already gone with _prepare_chat).
                del body
                await self._forward_chat(scope, send, url, outgoing, exchange)
            else:
                headers = upstream_request_headers(scope["headers"], fallback_api_key=self._api_key)
                await self._relay(send, scope["method"], url, headers, body, exchange, chat_headers=None)
        except ProxyError as error:
            exchange.status = error.status
            exchange.error = exchange.error or (error.code or error.type)
            self.metrics.errors.labels(exchange.error).inc()
            exchange.responded = True
            with contextlib.suppress(OSError):
                await ResponseWriter(send, extra_headers=exchange.extra_headers).fail(error)
        except ClientDisconnected:
            exchange.error = "client_disconnected"
        except asyncio.CancelledError:
            if exchange.error != "client_disconnected":
                raise
            # Cancelled by our own disconnect watcher: the client is gone, nothing to answer.
        finally:
            exchange.responded = True
            if watcher is not None:
                watcher.cancel()
            self._record(exchange)

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        declared = header_value(scope["headers"], b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._max_body:
            raise ProxyError(
                413,
                f"The request body exceeds the proxy's limit of {self._max_body} bytes.",
                code="request_too_large",
            )
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnected
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > self._max_body:
                    raise ProxyError(
                        413,
                        f"The request body exceeds the proxy's limit of {self._max_body} bytes.",
                        code="request_too_large",
                    )
                chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _prepare_chat(self, scope: Scope, body: bytes, url: str, exchange: Exchange) -> Outgoing:
        """Parse the request and apply its policy; what goes upstream, and nothing more."""
        headers_in = scope["headers"]
        requested_policy = header_value(headers_in, b"x-compaction-policy")
        policy_name = requested_policy.decode("latin-1") if requested_policy else self.settings.policy
        policy = self.policies.get(policy_name)
        if policy is None:
            raise ProxyError(
                400,
                f"Unknown compaction policy {policy_name!r}. Valid policies: {self._valid_policies}.",
                code="unknown_policy",
                param="X-Compaction-Policy",
            )
        requested_mode = header_value(headers_in, b"x-compaction-mode")
        mode = requested_mode.decode("latin-1") if requested_mode else self.settings.mode
        if mode not in _MODES:
            raise ProxyError(
                400,
                f"Unknown compaction mode {mode!r}. Valid modes: {', '.join(_MODES)}.",
                code="unknown_mode",
                param="X-Compaction-Mode",
            )
        exchange.mode = mode
        exchange.policy = policy_name if mode != "off" else "off"
        chat_headers = [
            (b"x-compaction-policy", exchange.policy.encode()),
            (b"x-compaction-mode", mode.encode()),
        ]
        outgoing = Outgoing(chat_headers, content=body)
        if mode == "off":
            return outgoing
        tenant = tenant_of(headers_in)
        if self.large.wants(body):
            parsed, messages_before, outcome, session = await self._compute_large(
                body, headers_in, policy, tenant, exchange, chat_headers
            )
        else:
            parsed, messages_before, outcome, session = await self._compute(
                body, headers_in, policy, tenant, exchange, chat_headers
            )
        exchange.outcome, exchange.tenant, exchange.session = _kept_for_event(outcome), tenant, session
        exchange.model, exchange.messages_before = parsed.get("model"), messages_before
        exchange.messages_after = len(outcome.messages) if outcome.messages is not None else messages_before
        if outcome.offloads:
            exchange.offloaded_bytes = sum(
                len(o.content.encode("utf-8", "replace")) for o in outcome.offloads.values()
            )
        exchange.tokens_before = outcome.tokens_before
        exchange.tokens_after = outcome.tokens_after
        exchange.mechanisms = outcome.mechanisms
        exchange.trigger = outcome.trigger
        # A client history that diverged from its checkpoint (edited or truncated) is recorded.
        exchange.checkpoint_dropped = outcome.facts.checkpoint_dropped is not None
        chat_headers.append((b"x-compaction-tokens-before", str(outcome.tokens_before).encode()))
        chat_headers.append((b"x-compaction-tokens-after", str(outcome.tokens_after).encode()))
        if outcome.trigger is not None:
            chat_headers.append((b"x-compaction-trigger", outcome.trigger.encode()))
        if mode == "shadow" and outcome.messages is not None and self.shadow.wanted():
            exchange.compare_body = {**parsed, "messages": outcome.messages}
            exchange.compare_url = url
            exchange.compare_headers = upstream_request_headers(headers_in, fallback_api_key=self._api_key)
            exchange.captured = bytearray()
        if (
            mode == "enforce"
            and outcome.messages is not None
            and outcome.checkpoint.handles  # cheap: no handle issued, none to find in the view
            and names_a_handle(outcome.messages)
        ):
            outgoing.content = b""
            outgoing.loop_body = self._with_read_tool({**parsed, "messages": outcome.messages})
            outgoing.tenant = tenant
            outgoing.window = self.windows.window_for(parsed.get("model"))
            outgoing.reserve = answer_reserve(parsed, _policy_reserve(policy))
            return outgoing
        outgoing.content = self._view_bytes(body, parsed, outcome, mode)
        return outgoing

    def _skip(self, reason: str | None, exchange: Exchange, chat_headers: list[tuple[bytes, bytes]]) -> None:
        """A body only the lenient parser reads (lone surrogates, huge integers, NaN) may not
        survive re-encoding, storage or events, and a history with fields of impossible types
        means nothing to compact: both are counted and passed through unchanged."""
        if reason:
            exchange.skipped = reason
            chat_headers.append((b"x-compaction-skipped", reason.encode("ascii", "replace")))

    async def _compute(
        self,
        body: bytes,
        headers_in: list[tuple[bytes, bytes]],
        policy: Policy,
        tenant: str,
        exchange: Exchange,
        chat_headers: list[tuple[bytes, bytes]],
    ) -> tuple[dict[str, Any], int, PolicyOutcome, str]:
        """Parse, count and compact on the event loop (requests of ordinary size)."""
        parsed, lenient = _parse_json(body)
        if not isinstance(parsed, dict):
            raise ProxyError(400, "The request body must be a JSON object.")
        messages = parsed.get("messages")
        if not isinstance(messages, list):
            raise ProxyError(400, "'messages' is a required property and must be an array.", param="messages")
        exchange.stream = parsed.get("stream") is True
        encoding = self.counter.encoding_for(parsed.get("model"))
        if not self.counter.is_loaded(encoding):
            # Another model family's encoding: loaded once, off the event loop.
            await asyncio.to_thread(self.counter.warm_up, [encoding])
        skipped = "lenient JSON" if lenient else shape_problem(messages)
        self._skip(skipped, exchange, chat_headers)
        effective = Policy(name=policy.name, description=policy.description, stages=()) if skipped else policy
        # A checkpoint belongs to one policy: switching policies mid-session starts afresh.
        # A policy without stages keeps no session state: named only if its events are recorded.
        named = bool(effective.stages) or self.settings.events.record_skipped
        resolution = None
        if named:
            explicit = header_value(headers_in, b"x-session-id")
            digests = [] if explicit else [self.digests.message(m) for m in messages]
            resolution = await self._session_of(
                headers_in, root_session(parsed, tenant), tenant, policy.name, digests
            )
        session = resolution.session + ":" + policy.name if resolution else ""
        window = self.windows.window_for(parsed.get("model"))
        injected = self.counter.count_tools([self._read_schema], encoding)

        async def compute(checkpoint: Checkpoint | None, summarizer: Any) -> PolicyOutcome:
            return await effective.apply(
                parsed,
                self.counter,
                window=window,
                checkpoint=checkpoint,
                summarizer=summarizer,
                digests=self.digests,
                # The read tool's schema, which comes with any view that names a saved output.
                injected_tokens=injected,
            )

        outcome = await self._apply_policy(
            effective, headers_in, tenant, session, resolution, exchange, compute
        )
        return parsed, len(messages), outcome, session

    async def _compute_large(
        self,
        body: bytes,
        headers_in: list[tuple[bytes, bytes]],
        policy: Policy,
        tenant: str,
        exchange: Exchange,
        chat_headers: list[tuple[bytes, bytes]],
    ) -> tuple[dict[str, Any], int, PolicyOutcome, str]:
        """The same, for a large body: parsed, counted and compacted in a worker process
        (held for both phases: it keeps the parsed body between them)."""
        async with self.large.worker() as worker:
            return await self._compute_in(worker, body, headers_in, policy, tenant, exchange, chat_headers)

    async def _compute_in(
        self,
        worker: LargeWorker,
        body: bytes,
        headers_in: list[tuple[bytes, bytes]],
        policy: Policy,
        tenant: str,
        exchange: Exchange,
        chat_headers: list[tuple[bytes, bytes]],
    ) -> tuple[dict[str, Any], int, PolicyOutcome, str]:
        explicit = header_value(headers_in, b"x-session-id")
        named = bool(policy.stages) or self.settings.events.record_skipped
        inspected = await worker.inspect(body, tenant, with_digests=named and not explicit)
        if inspected.error is not None:
            status, message, param = inspected.error
            raise ProxyError(status, message, param=param)
        head = inspected.head
        exchange.stream = head.get("stream") is True
        self._skip(inspected.skipped, exchange, chat_headers)
        skip = inspected.skipped is not None
        effective = Policy(name=policy.name, description=policy.description, stages=()) if skip else policy
        named = bool(effective.stages) or self.settings.events.record_skipped
        resolution = (
            await self._session_of(headers_in, inspected.root, tenant, policy.name, inspected.digests)
            if named
            else None
        )
        session = resolution.session + ":" + policy.name if resolution else ""
        encoding = self.counter.encoding_for(head.get("model"))
        window = self.windows.window_for(head.get("model"))
        view: dict[str, Any] | None = None

        async def compute(checkpoint: Checkpoint | None, summarizer: Any) -> PolicyOutcome:
            nonlocal view
            computed = await worker.apply(
                policy=policy.name,
                window=window,
                checkpoint=checkpoint,
                injected_tokens=self.counter.count_tools([self._read_schema], encoding),
                session=session,
                client_key=bearer_key(headers_in),
                skip=skip,
            )
            outcome, view = computed.outcome()
            return outcome

        outcome = await self._apply_policy(
            effective, headers_in, tenant, session, resolution, exchange, compute
        )
        parsed = {k: v for k, v in (view or head).items() if k != "messages"}
        return parsed, inspected.messages, outcome, session

    async def _forward_chat(
        self, scope: Scope, send: Send, url: str, outgoing: Outgoing, exchange: Exchange
    ) -> None:
        if outgoing.loop_body is not None:
            await self._read_loop(send, url, scope["headers"], outgoing, exchange)
            return
        headers = upstream_request_headers(scope["headers"], fallback_api_key=self._api_key)
        await self._relay(
            send, "POST", url, headers, outgoing.take_content(), exchange, chat_headers=outgoing.chat_headers
        )

    def _with_read_tool(self, body: dict[str, Any]) -> dict[str, Any]:
        tools = body.get("tools")
        return {**body, "tools": [*(tools if isinstance(tools, list) else []), self._read_schema]}

    def _driver(
        self,
        body: dict[str, Any],
        *,
        url: str,
        headers: list[tuple[bytes, bytes]],
        tenant: str,
        writer: ResponseWriter,
        request_id: str,
        window: int,
        reserve: int,
    ) -> LoopDriver:
        loop = ReadLoop(
            body,
            counter=self.counter,
            window=window,
            reserve=reserve,
            limits=self.loop_limits,
            requested=requested_answer_tokens(body),
        )
        return LoopDriver(
            loop,
            upstream=self.upstream,
            store=self.store,
            url=url,
            headers=headers,
            tenant=tenant,
            writer=writer,
            request_id=request_id,
        )

    async def _ask_upstream(
        self, url: str, headers: list[tuple[bytes, bytes]], body: dict[str, Any], tenant: str
    ) -> tuple[int, bytes]:
        """One non-streamed answer to ``body``, with saved-output reads answered as for a real
        request; for shadow comparisons, whose answers are never returned to anyone."""
        headers = [(k, v) for k, v in headers if k != b"accept-encoding"] + [
            (b"accept-encoding", b"identity")
        ]
        if names_a_handle(body["messages"]):
            status = 0
            parts: list[bytes] = []

            async def capture(message: dict[str, Any]) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                else:
                    parts.append(message.get("body", b""))

            window = self.windows.window_for(body.get("model"))
            driver = self._driver(
                self._with_read_tool(body),
                url=url,
                headers=headers,
                tenant=tenant,
                writer=ResponseWriter(capture),
                request_id="shadow",
                window=window,
                reserve=answer_reserve(body, 1024),
            )
            await driver.run()
            return status, b"".join(parts)
        response = await self.upstream.open("POST", url, headers, orjson.dumps(body))
        try:
            raw = await response.aread()
        finally:
            await response.aclose()
        return response.status_code, raw

    async def _read_loop(
        self,
        send: Send,
        url: str,
        headers_in: list[tuple[bytes, bytes]],
        outgoing: Outgoing,
        exchange: Exchange,
    ) -> None:
        """The view names saved outputs: inject read_tool_output and answer it here."""
        assert outgoing.loop_body is not None
        writer = ResponseWriter(
            send,
            extra_headers=[*outgoing.chat_headers, *exchange.extra_headers],
            mark_done=exchange.mark_responded,
        )
        driver = self._driver(
            outgoing.loop_body,
            url=url,
            headers=upstream_request_headers(headers_in, fallback_api_key=self._api_key),
            tenant=outgoing.tenant,
            writer=writer,
            request_id=exchange.request_id,
            window=outgoing.window,
            reserve=outgoing.reserve,
        )
        outgoing.loop_body = None  # the loop owns it now
        result = await driver.run()
        exchange.responded = True
        exchange.status = writer.status if writer.started else result.status
        exchange.upstream_seconds = result.upstream_seconds
        exchange.read_rounds = result.rounds
        exchange.reads = result
        # The largest request actually sent upstream for this client request.
        exchange.tokens_after = max(exchange.tokens_after or 0, result.largest_request)
        if result.error:
            exchange.error = result.error
            self.metrics.errors.labels(result.error).inc()
        for kind in result.reads:
            self.metrics.reads.labels(kind).inc()
        self.metrics.read_rounds.observe(result.rounds)

    async def _session_of(
        self, headers: list[tuple[bytes, bytes]], root: str, tenant: str, policy: str, digests: list[str]
    ) -> Resolution:
        """The client's ``X-Session-Id``, else the session whose requests this one extends."""
        explicit = header_value(headers, b"x-session-id")
        if explicit:
            return Resolution(explicit_session(tenant, explicit))
        if not self.sessions.shared:
            return self.branches.resolve(f"{root}:{policy}", root, digests)
        try:
            return await self.store.resolve_branch(tenant, f"{root}:{policy}", root, digests)
        except Exception:  # the store is down: the run's first session, as before branches
            self.metrics.errors.labels("store_read").inc()
            return Resolution(root)

    async def _inherited(
        self, tenant: str, resolution: Resolution, policy: str, exchange: Exchange
    ) -> Checkpoint | None:
        """A fork starts from its parent's checkpoint when everything that checkpoint decided
        lies in the messages they share (a summary never covers what the fork does not have)."""
        if resolution.parent is None:
            return None
        parent = f"{resolution.parent}:{policy}"
        checkpoint = self.sessions.checkpoint(parent) or await self._load_checkpoint(tenant, parent)
        inherited = checkpoint is not None and (
            checkpoint.summary is None or checkpoint.summary_at + checkpoint.covered <= resolution.common
        )
        exchange.session_fork = {
            "parent": parent,
            "common_messages": resolution.common,
            "inherited": inherited,
        }
        return checkpoint if inherited else None

    async def _apply_policy(
        self,
        policy: Policy,
        headers: list[tuple[bytes, bytes]],
        tenant: str,
        session: str,
        resolution: Resolution | None,
        exchange: Exchange,
        compute: Callable[[Checkpoint | None, Any], Awaitable[PolicyOutcome]],
    ) -> PolicyOutcome:
        """Run ``compute`` (the policy, here or in a worker process) under the session's lock,
        from its checkpoint; store what it offloaded and keep its next checkpoint."""
        if not policy.stages:
            return await compute(None, None)
        async with self.sessions.lock(session):
            checkpoint = self.sessions.checkpoint(session)
            if checkpoint is None:
                checkpoint = await self._load_checkpoint(tenant, session)
            if checkpoint is None and resolution is not None:
                checkpoint = await self._inherited(tenant, resolution, policy.name, exchange)
            summarizer = (
                self.summarizer.for_session(session, bearer_key(headers)) if self.summarizer else None
            )
            outcome = await compute(checkpoint, summarizer)
            if outcome.offloads:
                try:
                    # Durably stored before any view naming the handles is sent.
                    await self.store.put_outputs(tenant, list(outcome.offloads.values()))
                except Exception:  # fail open: the client's own request goes through
                    self.metrics.errors.labels("store_write").inc()
                    return PolicyOutcome(
                        None,
                        outcome.tokens_before,
                        outcome.tokens_before,
                        checkpoint=checkpoint or Checkpoint(),
                    )
            self.sessions.save(session, outcome.checkpoint)
            # The request counter changes on every request; only other changes are worth a write.
            changed = (
                checkpoint is None or replace(outcome.checkpoint, requests=checkpoint.requests) != checkpoint
            )
            if changed and outcome.mechanisms:
                if self.sessions.shared:
                    # Another worker may serve this session's next request: write it now.
                    await self._save_checkpoint(tenant, session, outcome.checkpoint)
                else:
                    self._persist(tenant, session, outcome.checkpoint)
        return outcome

    async def _load_checkpoint(self, tenant: str, session: str) -> Checkpoint | None:
        try:
            return await self.store.load_checkpoint(tenant, session)
        except Exception:  # a missing checkpoint only costs one fresh compaction
            self.metrics.errors.labels("store_read").inc()
            return None

    async def _save_checkpoint(self, tenant: str, session: str, checkpoint: Checkpoint) -> None:
        try:
            await self.store.save_checkpoint(tenant, session, checkpoint)
        except Exception:  # a lost checkpoint costs one fresh compaction, never the request
            self.metrics.errors.labels("store_write").inc()

    def _persist(self, tenant: str, session: str, checkpoint: Checkpoint) -> None:
        """Write a changed checkpoint in the background: memory stays authoritative in this
        process; the store lets a restarted or another replica continue the session."""

        task = asyncio.create_task(self._save_checkpoint(tenant, session, checkpoint))
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    @staticmethod
    def _view_bytes(original: bytes, parsed: dict[str, Any], outcome: PolicyOutcome, mode: str) -> bytes:
        """The bytes the upstream receives: the client's own bytes whenever nothing changed."""
        if mode == "shadow" or outcome.messages is None:
            return original
        rewritten = dict(parsed)
        rewritten["messages"] = outcome.messages
        try:
            return orjson.dumps(rewritten)
        except TypeError:
            return json.dumps(rewritten, separators=(",", ":")).encode()

    async def _relay(
        self,
        send: Send,
        method: str,
        url: str,
        headers: list[tuple[bytes, bytes]],
        content: bytes,
        exchange: Exchange,
        chat_headers: list[tuple[bytes, bytes]] | None,
    ) -> None:
        sent_at = time.perf_counter()
        try:
            response = await self.upstream.open(method, url, headers, content)
        except httpx.HTTPError as exc:
            exchange.upstream_seconds = time.perf_counter() - sent_at
            exchange.error = failure_kind(exc)
            raise upstream_failure(exc) from None
        del content  # sent: not kept while the answer streams
        writer = ResponseWriter(send, extra_headers=exchange.extra_headers, mark_done=exchange.mark_responded)
        try:
            out_headers = client_response_headers(response.headers.raw)
            if chat_headers is not None:
                if header_value(out_headers, b"x-request-id") is None:
                    out_headers.append((b"x-request-id", exchange.request_id.encode()))
                out_headers.extend(chat_headers)
            exchange.status = response.status_code
            is_sse = _SSE in (response.headers.get("content-type", "").encode("latin-1"))
            exchange.captured_sse = is_sse
            writer.start(response.status_code, out_headers, streaming=is_sse)
            await writer.write(b"")  # headers now: a stream's first event may take the model a while
            first = True
            try:
                async for chunk in response.stream:  # type: ignore[union-attr]
                    if first and exchange.stream:
                        self.metrics.ttfb_seconds.labels(exchange.policy).observe(
                            time.perf_counter() - exchange.started
                        )
                        first = False
                    if exchange.captured is not None and len(exchange.captured) < _CAPTURE_LIMIT:
                        exchange.captured += chunk
                    await writer.write(chunk)
            except httpx.HTTPError as exc:
                exchange.error = "upstream_" + (
                    "timeout" if isinstance(exc, httpx.TimeoutException) else "reset"
                )
                self.metrics.errors.labels(exchange.error).inc()
                await writer.fail(
                    ProxyError(
                        502,
                        "The upstream connection failed in the middle of the stream.",
                        type="upstream_error",
                        code=exchange.error,
                    )
                )
                return
            await writer.finish()
        finally:
            exchange.upstream_seconds = time.perf_counter() - sent_at
            await response.aclose()

    def _record_compaction(self, exchange: Exchange) -> None:
        outcome = exchange.outcome
        if outcome is None:
            return
        if not (outcome.mechanisms or outcome.trigger or self.settings.events.record_skipped):
            return
        m = self.metrics
        if outcome.trigger:
            for mechanism in outcome.mechanisms or ("none",):
                m.compactions.labels(exchange.policy, mechanism, outcome.trigger).inc()
        if outcome.offloads:
            m.offloaded.labels(exchange.policy).inc(len(outcome.offloads))
            m.offloaded_bytes.labels(exchange.policy).inc(exchange.offloaded_bytes)
        summary = outcome.facts.summary
        if summary is not None:
            result = (
                "fallback" if summary.fallback_reason else ("ledger" if summary.model == "ledger" else "ok")
            )
            m.summaries.labels(result).inc()
            m.summary_seconds.observe(summary.seconds)
        version, config_hash = self._policy_meta.get(exchange.policy, ("", ""))
        event = build_event(
            request_id=exchange.request_id,
            tenant=exchange.tenant,
            session=exchange.session,
            model=exchange.model,
            mode=exchange.mode,
            policy=exchange.policy,
            policy_version=version,
            policy_hash=config_hash,
            outcome=outcome,
            messages_before=exchange.messages_before,
            reads=exchange.reads,
            messages_after=exchange.messages_after,
            offloaded_bytes=exchange.offloaded_bytes,
            session_fork=exchange.session_fork,
        )
        if not (outcome.mechanisms or outcome.trigger):
            # A light record of a request the policy left alone.
            event.pop("checkpoint", None)
            event["details"] = {}
        if exchange.compare_body is not None and exchange.captured is not None and exchange.status == 200:
            policy = exchange.policy

            def compared(result: dict[str, Any]) -> None:
                outcome_label = "error" if result["error"] else ("diverged" if result["diverged"] else "same")
                self.metrics.shadow_compares.labels(policy, outcome_label).inc()
                self.events.emit({**event, "shadow_compare": result})

            url, headers, tenant = exchange.compare_url, exchange.compare_headers, exchange.tenant

            async def ask(body: dict[str, Any]) -> tuple[int, bytes]:
                return await self._ask_upstream(url, headers, body, tenant)

            self.shadow.start(
                ask, exchange.compare_body, bytes(exchange.captured), exchange.captured_sse, compared
            )
            return
        self.events.emit(event)

    def _record(self, exchange: Exchange) -> None:
        try:
            self._record_compaction(exchange)
        except Exception as exc:  # recording must never fail a request that was answered
            self.metrics.errors.labels("event").inc()
            self.log.warning("event_failed", error=type(exc).__name__)
        total = time.perf_counter() - exchange.started
        overhead = max(0.0, total - exchange.upstream_seconds)
        m = self.metrics
        m.requests.labels(
            exchange.route, exchange.policy, exchange.mode, _status_class(exchange.status)
        ).inc()
        if exchange.upstream_seconds:
            m.upstream_seconds.labels(exchange.route).observe(exchange.upstream_seconds)
        m.overhead_seconds.labels(exchange.route).observe(overhead)
        if exchange.tokens_before is not None and exchange.tokens_after is not None:
            m.tokens_before.labels(exchange.policy, exchange.mode).observe(exchange.tokens_before)
            m.tokens_after.labels(exchange.policy, exchange.mode).observe(exchange.tokens_after)
            saved = exchange.tokens_before - exchange.tokens_after
            if saved > 0:
                m.tokens_saved.labels(exchange.policy, exchange.mode).inc(saved)
        self.log.info(
            "request",
            request_id=exchange.request_id,
            route=exchange.route,
            method=exchange.method,
            status=exchange.status,
            policy=exchange.policy,
            mode=exchange.mode,
            stream=exchange.stream,
            tokens_before=exchange.tokens_before,
            tokens_after=exchange.tokens_after,
            upstream_s=round(exchange.upstream_seconds, 6),
            overhead_s=round(overhead, 6),
            error=exchange.error,
            read_rounds=exchange.read_rounds,
            mechanisms=list(exchange.mechanisms),
            trigger=exchange.trigger,
            checkpoint_dropped=exchange.checkpoint_dropped,
            skipped=exchange.skipped,
            pid=self._pid,
        )
