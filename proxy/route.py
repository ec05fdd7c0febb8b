"""A compacting route: a request of a dialect the proxy compacts, from its bytes to its answer.

The policy and mode come from the headers (or the configuration); the dialect reads the body
into the neutral conversation (a worker process does it for a large body); the compaction
service makes the view; the dialect writes the view back; and the request goes upstream through
the ``read_tool_output`` loop when the view names a saved output, else as a plain relay. Only
what goes upstream is kept while the upstream works (seconds for a model): the client's bytes
and their parsed copy are released first.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from policies.handles import MENTION, names_a_handle
from policies.pipeline import Policy, requested_answer_tokens
from policies.tokens import TokenCounter
from proxy.agent_compaction import agent_compaction
from proxy.compaction import Compacted, CompactionService, policy_reserve
from proxy.dialects.anthropic import binding_headers
from proxy.dialects.base import Dialect, Parsed
from proxy.errors import ProxyError
from proxy.exchange import (
    Body,
    Exchange,
    NestedTooDeep,
    ShadowCompare,
    dump_json,
    kept_for_event,
    parse_json,
)
from proxy.forwarding import header_value
from proxy.hidden_rounds import HiddenRounds
from proxy.loop_driver import LoopDriver
from proxy.metrics import Metrics
from proxy.providers import Provider
from proxy.read_loop import LoopLimits, ReadLoop
from proxy.relay import relay
from proxy.response_writer import ResponseWriter
from proxy.sessions import tenant_of
from proxy.shadow import ShadowComparer
from proxy.store import Store
from proxy.token_factors import ScaledWindows
from proxy.upstream import Upstream

Send = Callable[[dict[str, Any]], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]
MODES = ("enforce", "shadow", "off")
# Bytes of a relayed answer kept to read the prompt tokens it reports (a stream reports them in
# its first event; a JSON answer at its end).
HEAD_LIMIT = 256 * 1024


@dataclass(slots=True)
class Outgoing:
    """What goes upstream: the bytes to send, or the read loop's first body."""

    route_headers: Headers
    content: bytes = b""
    loop_body: dict[str, Any] | None = None
    window: int = 0
    reserve: int = 0
    requested: int = 0
    # A Messages body's thinking settings (its stale-thinking binding needs a beta header).
    thinking: Any = None
    # The session's saved outputs (a read of handle "*" searches them all).
    handles: tuple[str, ...] = ()


class CompactingRoute:
    def __init__(
        self,
        *,
        dialects: Mapping[str, Dialect],
        policies: Mapping[str, Policy],
        default_policy: str,
        default_mode: str,
        service: CompactionService,
        counter: TokenCounter,
        windows: ScaledWindows,
        upstream: Upstream,
        store: Store,
        metrics: Metrics,
        shadow: ShadowComparer,
        loop_limits: LoopLimits,
        read_max_lines: int,
        hidden: HiddenRounds,
    ) -> None:
        self.dialects = dialects
        self.policies = policies
        self.default_policy = default_policy
        self.default_mode = default_mode
        self.service = service
        self.counter = counter
        self.windows = windows
        self.upstream = upstream
        self.store = store
        self.metrics = metrics
        self.shadow = shadow
        self.loop_limits = loop_limits
        self.read_max_lines = read_max_lines
        self.hidden = hidden
        self._valid_policies = ", ".join(sorted(policies))

    async def handle(
        self,
        send: Send,
        dialect: str,
        headers: Headers,
        body: Body,
        url: str,
        exchange: Exchange,
        provider: Provider,
    ) -> None:
        outgoing = await self._prepare(dialect, headers, body.take(), url, exchange, provider)
        upstream_headers = provider.upstream_headers(headers)
        if outgoing.thinking is not None:
            upstream_headers = binding_headers(upstream_headers, {"thinking": outgoing.thinking})
        if outgoing.loop_body is not None:
            await self._read_loop(send, dialect, url, upstream_headers, outgoing, exchange, provider)
            return
        content, outgoing.content = outgoing.content, b""
        await relay(
            upstream=self.upstream,
            metrics=self.metrics,
            send=send,
            method="POST",
            url=url,
            headers=upstream_headers,
            content=content,
            exchange=exchange,
            route_headers=outgoing.route_headers,
            error_event=self.dialects[dialect].error_event,
            error_body=provider.error_body,
        )

    def _choose(self, headers: Headers, exchange: Exchange) -> tuple[Policy, str]:
        requested = header_value(headers, b"x-compaction-policy")
        name = requested.decode("latin-1") if requested else self.default_policy
        policy = self.policies.get(name)
        if policy is None:
            raise ProxyError(
                400,
                f"Unknown compaction policy {name!r}. Valid policies: {self._valid_policies}.",
                code="unknown_policy",
                param="X-Compaction-Policy",
            )
        requested_mode = header_value(headers, b"x-compaction-mode")
        mode = requested_mode.decode("latin-1") if requested_mode else self.default_mode
        if mode not in MODES:
            raise ProxyError(
                400,
                f"Unknown compaction mode {mode!r}. Valid modes: {', '.join(MODES)}.",
                code="unknown_mode",
                param="X-Compaction-Mode",
            )
        exchange.mode = mode
        exchange.policy = name if mode != "off" else "off"
        return policy, mode

    async def _prepare(
        self, name: str, headers: Headers, body: bytes, url: str, exchange: Exchange, provider: Provider
    ) -> Outgoing:
        policy, mode = self._choose(headers, exchange)
        route_headers = [
            (b"x-compaction-policy", exchange.policy.encode()),
            (b"x-compaction-mode", mode.encode()),
        ]
        outgoing = Outgoing(route_headers, content=body)
        if mode == "off":
            return outgoing
        dialect = self.dialects[name]
        tenant = tenant_of(headers)
        # The client's credential is for the provider its request addressed, and only there.
        origin = (provider.base.scheme, provider.base.host, provider.base.port)
        parsed = None
        if self.service.large.wants(body):
            try:
                compacted = await self.service.compact_large(
                    body, dialect=name, policy=policy, tenant=tenant, headers=headers, client_origin=origin
                )
            except (NestedTooDeep, *_UNREADABLE) as exc:
                return _as_sent(outgoing, exchange, route_headers, _why_unreadable(name, exc))
        else:
            try:
                data, lenient = parse_json(body)
            except NestedTooDeep as exc:
                return _as_sent(outgoing, exchange, route_headers, _why_unreadable(name, exc))
            restored = 0
            if name == "anthropic" and isinstance(data, dict):
                data, restored = await self.hidden.restore(tenant, data)
            try:
                parsed = dialect.parse(data, lenient)
            except _UNREADABLE as exc:
                return _as_sent(outgoing, exchange, route_headers, _why_unreadable(name, exc))
            if restored:
                parsed.notes["restored_read_rounds"] = restored
            skipped = parsed.skipped or self._agent_compaction(headers, parsed)
            compacted = await self.service.compact(
                parsed.neutral,
                policy=policy,
                tenant=tenant,
                headers=headers,
                skipped=skipped,
                client_origin=origin,
            )
            compacted.stream, compacted.notes, compacted.head = parsed.stream, parsed.notes, parsed.body
        outcome = compacted.outcome
        self._record(exchange, compacted, tenant, route_headers)
        view_body = compacted.view_body
        if view_body is None and outcome.messages is not None and parsed is not None:
            view_body = dialect.render(parsed, outcome.messages, outcome.origin or ())
        upstream_headers = provider.upstream_headers(headers)
        if self.windows.factors.default_for(exchange.model) is not None:
            # A model counted with a factor: its answer's reported prompt tokens calibrate it.
            exchange.token_factor = self.windows.factors.factor(exchange.model)
            exchange.head_limit = HEAD_LIMIT
        if mode == "shadow" and view_body is not None and self.shadow.wanted():
            exchange.compare = ShadowCompare(body=view_body, url=url, headers=upstream_headers, dialect=name)
        if (
            mode == "enforce"
            and view_body is not None
            and outcome.messages is not None
            and outcome.checkpoint.handles  # cheap: no handle issued, none to find in the view
            and names_a_handle(outcome.messages)
            and not _several_streamed_choices(view_body)
        ):
            outgoing.content = b""
            outgoing.loop_body = dialect.with_read_tool(view_body, self.read_max_lines)
            outgoing.window = self.windows.window_for(compacted.head.get("model"))
            outgoing.requested = dialect.answer_tokens(view_body)
            outgoing.reserve = max(policy_reserve(policy), outgoing.requested)
            outgoing.handles = tuple(outcome.checkpoint.handles)
            outgoing.thinking = outgoing.loop_body.get("thinking") if name == "anthropic" else None
            return outgoing
        if mode == "enforce" and view_body is not None:
            outgoing.content = dump_json(view_body)
            outgoing.thinking = view_body.get("thinking") if name == "anthropic" else None
        return outgoing

    def _agent_compaction(self, headers: Headers, parsed: Parsed) -> str | None:
        """The agent's own compaction request goes as sent when it fits the window (see
        ``proxy/agent_compaction.py``); the decision is noted for the event."""
        agent = agent_compaction(headers, parsed.neutral["messages"])
        if agent is None:
            return None
        neutral = parsed.neutral
        budget = self.windows.window_for(neutral.get("model")) - max(1024, requested_answer_tokens(neutral))
        fits = self.counter.count_request(neutral).total <= budget
        parsed.notes["agent_compaction"] = {
            "agent": agent,
            "action": "forwarded as sent" if fits else "compacted to fit the window",
        }
        return f"{agent}'s own compaction request" if fits else None

    def _record(self, exchange: Exchange, compacted: Compacted, tenant: str, route_headers: Headers) -> None:
        outcome = compacted.outcome
        exchange.stream = compacted.stream
        if compacted.skipped:
            # Lenient JSON, a malformed history, a history the proxy cannot see: sent as it came.
            exchange.skipped = compacted.skipped
            route_headers.append((b"x-compaction-skipped", compacted.skipped.encode("ascii", "replace")))
        exchange.outcome, exchange.tenant, exchange.session = (
            kept_for_event(outcome),
            tenant,
            compacted.session,
        )
        exchange.model, exchange.messages_before = compacted.head.get("model"), compacted.messages
        exchange.messages_after = (
            len(outcome.messages) if outcome.messages is not None else compacted.messages
        )
        exchange.session_fork = compacted.session_fork
        exchange.dialect_notes = compacted.notes
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
        route_headers.append((b"x-compaction-tokens-before", str(outcome.tokens_before).encode()))
        route_headers.append((b"x-compaction-tokens-after", str(outcome.tokens_after).encode()))
        if outcome.trigger is not None:
            route_headers.append((b"x-compaction-trigger", outcome.trigger.encode()))

    def _driver(
        self,
        dialect: str,
        body: dict[str, Any],
        *,
        url: str,
        headers: Headers,
        tenant: str,
        writer: ResponseWriter,
        request_id: str,
        window: int,
        reserve: int,
        requested: int,
        handles: tuple[str, ...] = (),
    ) -> LoopDriver:
        loop = ReadLoop(
            body,
            dialect=self.dialects[dialect],
            counter=self.counter,
            window=window,
            reserve=reserve,
            limits=self.loop_limits,
            requested=requested,
            handles=handles,
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

    async def _read_loop(
        self,
        send: Send,
        dialect: str,
        url: str,
        headers: Headers,
        outgoing: Outgoing,
        exchange: Exchange,
        provider: Provider,
    ) -> None:
        """The view names saved outputs: the read tool is offered and answered here."""
        assert outgoing.loop_body is not None
        writer = ResponseWriter(
            send,
            extra_headers=[*outgoing.route_headers, *exchange.extra_headers],
            error_event=self.dialects[dialect].error_event,
            error_body=provider.error_body,
            mark_done=exchange.mark_responded,
        )
        driver = self._driver(
            dialect,
            outgoing.loop_body,
            url=url,
            headers=headers,
            tenant=exchange.tenant,
            writer=writer,
            request_id=exchange.request_id,
            window=outgoing.window,
            reserve=outgoing.reserve,
            requested=outgoing.requested,
            handles=outgoing.handles,
        )
        first = len(outgoing.loop_body.get("messages") or []) if dialect == "anthropic" else 0
        outgoing.loop_body = None  # the loop owns it now
        result = await driver.run()
        if first and result.rounds and result.status == 200 and not result.error and result.final_answer:
            # The client gets the last round only: keep what it did not see, for when it echoes it.
            answer = [b for b in result.final_answer if not self.dialects[dialect].is_read_call(b)]
            await self.hidden.record(exchange.tenant, driver.loop.body["messages"][first:], answer)
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

    async def ask_upstream(
        self, dialect: str, url: str, headers: Headers, body: dict[str, Any], tenant: str
    ) -> tuple[int, bytes]:
        """One non-streamed answer to ``body``, with saved-output reads answered as for a real
        request; for shadow comparisons, whose answers are never returned to anyone."""
        headers = [(k, v) for k, v in headers if k != b"accept-encoding"] + [
            (b"accept-encoding", b"identity")
        ]
        body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        if MENTION.encode() in orjson.dumps(body):
            status = 0
            parts: list[bytes] = []

            async def capture(message: dict[str, Any]) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                else:
                    parts.append(message.get("body", b""))

            driver = self._driver(
                dialect,
                self.dialects[dialect].with_read_tool(body, self.read_max_lines),
                url=url,
                headers=headers,
                tenant=tenant,
                writer=ResponseWriter(capture),
                request_id="shadow",
                window=self.windows.window_for(body.get("model")),
                reserve=max(1024, self.dialects[dialect].answer_tokens(body)),
                requested=self.dialects[dialect].answer_tokens(body),
            )
            await driver.run()
            return status, b"".join(parts)
        response = await self.upstream.open("POST", url, headers, orjson.dumps(body))
        try:
            raw = await response.aread()
        finally:
            await response.aclose()
        return response.status_code, raw


def _several_streamed_choices(body: dict[str, Any]) -> bool:
    """A stream of ``n`` > 1 choices: the read tool is not offered (each choice would need its
    own read rounds inside one interleaved stream); the view still names its handles."""
    n = body.get("n")
    return body.get("stream") is True and isinstance(n, int) and not isinstance(n, bool) and n > 1


# What an adapter raises on a shape it cannot read (a wrong type deep in an item, nesting past
# the serializer's limit). Such a body is forwarded exactly as sent, never a 500: the upstream's
# own error answers it, and the header says why the policy was not applied.
_UNREADABLE = (TypeError, ValueError, KeyError, AttributeError, IndexError, RecursionError)


def _why_unreadable(dialect: str, exc: BaseException) -> str:
    if isinstance(exc, NestedTooDeep):
        return "JSON nested too deep to read"
    return f"unreadable {dialect} body ({type(exc).__name__})"


def _as_sent(outgoing: Outgoing, exchange: Exchange, route_headers: Headers, why: str) -> Outgoing:
    exchange.skipped = why
    route_headers.append((b"x-compaction-skipped", why.encode("ascii", "replace")))
    return outgoing
