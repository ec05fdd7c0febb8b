"""Running the ``read_tool_output`` loop for a request: building the loop and its driver, and
what a request records once it ran. Also the shadow comparison's upstream asker, which answers
saved-output reads the same way (its answers are never returned to anyone).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from policies.handles import MENTION
from policies.tokens import TokenCounter
from proxy.dialects.base import Dialect
from proxy.dialects.doors import Target
from proxy.read_loop.commands import LoopLimits
from proxy.read_loop.driver import LoopDriver
from proxy.read_loop.loop import ReadLoop
from proxy.state.store import Store
from proxy.state.token_factors import ScaledWindows
from proxy.telemetry.exchange import Exchange, LoopResult
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.tracing import RequestTrace
from proxy.upstream.pool import Upstream
from proxy.upstream.relay import Held, Refused
from proxy.wire.json_body import dump_json
from proxy.wire.response_writer import ResponseWriter

Send = Callable[[dict[str, Any]], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]


@dataclass(slots=True)
class LoopPlan:
    """A request the read loop serves: its first round's body (the read tool offered) and the
    room an answer needs."""

    body: dict[str, Any]
    window: int
    reserve: int
    requested: int
    # The session's saved outputs (a read of handle "*" searches them all).
    handles: tuple[str, ...] = ()
    # The request's own counter (``TokenCounter.for_request``): the view is counted already.
    counter: TokenCounter | None = None
    # A round's body as bytes: the first round's client items copied from the client's bytes.
    encode: Callable[[dict[str, Any]], bytes] = dump_json


class LoopRunner:
    def __init__(
        self,
        *,
        dialects: Mapping[str, Dialect],
        counter: TokenCounter,
        windows: ScaledWindows,
        upstream: Upstream,
        store: Store,
        metrics: Metrics,
        limits: LoopLimits,
        read_max_lines: int,
    ) -> None:
        self.dialects = dialects
        self.counter = counter
        self.windows = windows
        self.upstream = upstream
        self.store = store
        self.metrics = metrics
        self.limits = limits
        self.read_max_lines = read_max_lines

    def driver(
        self,
        dialect: Dialect,
        plan: LoopPlan,
        *,
        url: str,
        headers: Headers,
        tenant: str,
        writer: ResponseWriter,
        request_id: str,
        trace: RequestTrace | None = None,
    ) -> LoopDriver:
        loop = ReadLoop(
            plan.body,
            dialect=dialect,
            counter=plan.counter or self.counter,
            window=plan.window,
            reserve=plan.reserve,
            limits=self.limits,
            requested=plan.requested,
            handles=plan.handles,
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
            trace=trace,
            encode=plan.encode,
        )

    async def serve(
        self,
        send: Send,
        dialect: Dialect,
        plan: LoopPlan,
        *,
        url: str,
        headers: Headers,
        exchange: Exchange,
        writer: ResponseWriter,
        refused: Refused | None = None,
    ) -> Held | None:
        """The view names saved outputs: the read tool is offered and answered here. A refusal
        ``refused`` takes over before the client got anything is returned held, unanswered."""
        driver = self.driver(
            dialect,
            plan,
            url=url,
            headers=headers,
            tenant=exchange.tenant,
            writer=writer,
            request_id=exchange.request_id,
            trace=exchange.trace,
        )
        driver.refused = refused
        mark = dialect.read_loop_start(plan.body)
        plan.body = {}  # the loop owns it now
        result = await driver.run()
        await dialect.read_loop_end(exchange.tenant, mark, driver.loop.body, result)
        if driver.held is not None:
            return driver.held
        self._record(exchange, writer, result)
        return None

    def _record(self, exchange: Exchange, writer: ResponseWriter, result: LoopResult) -> None:
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

    async def ask(
        self,
        dialect_name: str,
        url: str,
        headers: Headers,
        body: dict[str, Any],
        tenant: str,
        target: Target | None = None,
    ) -> tuple[int, bytes]:
        """One non-streamed answer to ``body``, with saved-output reads answered as for a real
        request; for shadow comparisons, whose answers are never returned to anyone.
        ``target``: what the request's path said (the model of a Gemini door)."""
        dialect = self.dialects[dialect_name]
        if target is not None:
            dialect = dialect.at(Target(target.model, stream=False))
        headers = [(k, v) for k, v in headers if k != b"accept-encoding"] + [
            (b"accept-encoding", b"identity")
        ]
        body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        content = dump_json(body)
        if MENTION.encode() not in content:
            response = await self.upstream.open("POST", url, headers, content)
            try:
                raw = await response.aread()
            finally:
                await response.aclose()
            return response.status_code, raw
        status = 0
        parts: list[bytes] = []

        async def capture(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            else:
                parts.append(message.get("body", b""))

        requested = dialect.answer_tokens(body)
        plan = LoopPlan(
            dialect.with_read_tool(body, self.read_max_lines),
            window=self.windows.window_for(dialect.model_of(body)),
            reserve=max(1024, requested),
            requested=requested,
        )
        driver = self.driver(
            dialect,
            plan,
            url=url,
            headers=headers,
            tenant=tenant,
            writer=ResponseWriter(capture),
            request_id="shadow",
        )
        await driver.run()
        return status, b"".join(parts)
