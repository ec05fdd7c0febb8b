"""Delivering a prepared request: its view (or the client's bytes) upstream and the answer to
the client, as a plain relay or through the ``read_tool_output`` loop when the view names a
saved output. While the upstream works only what is sent is held: the draft's parse, view and
counter are released first."""

from __future__ import annotations

from proxy.read_loop.runner import LoopRunner
from proxy.route.draft import Draft, Send
from proxy.telemetry.metrics import Metrics
from proxy.upstream.pool import Upstream
from proxy.upstream.relay import Held, Refused, relay, relay_held
from proxy.wire.response_writer import ResponseWriter


async def deliver(
    send: Send,
    draft: Draft,
    *,
    upstream: Upstream,
    metrics: Metrics,
    loops: LoopRunner,
    refused: Refused | None,
) -> Held | None:
    """The answer to ``draft``; the upstream's answer held back instead when ``refused`` took
    it over (``upstream/relay.py``)."""
    draft.parsed = draft.compacted = draft.counter = draft.restored = draft.wire = None
    dialect, exchange = draft.dialect, draft.exchange
    if exchange.context_retry is not None:
        window = str(exchange.context_retry["window"]).encode()
        draft.route_headers.append((b"x-compaction-window-learned", window))
    headers = dialect.upstream_headers(draft.provider.upstream_headers(draft.headers), draft.view)
    draft.view = None
    if draft.loop is not None:
        writer = ResponseWriter(
            send,
            extra_headers=[*draft.route_headers, *exchange.extra_headers],
            error_event=dialect.error_event,
            error_body=draft.provider.error_body,
            mark_done=exchange.mark_responded,
            capture=exchange.canary_capture,
        )
        plan, draft.loop = draft.loop, None
        return await loops.serve(
            send,
            dialect,
            plan,
            url=draft.url,
            headers=headers,
            exchange=exchange,
            writer=writer,
            refused=refused,
        )
    content, draft.content = draft.content, b""
    return await relay(
        upstream=upstream,
        metrics=metrics,
        send=send,
        method="POST",
        url=draft.url,
        headers=headers,
        content=content,
        exchange=exchange,
        route_headers=draft.route_headers,
        error_event=dialect.error_event,
        error_body=draft.provider.error_body,
        refused=refused,
    )


async def deliver_held(send: Send, held: Held, draft: Draft) -> None:
    """An answer the upstream gave and the route held back, to the client as it came."""
    await relay_held(
        held,
        send=send,
        exchange=draft.exchange,
        route_headers=draft.route_headers,
        error_event=draft.dialect.error_event,
        error_body=draft.provider.error_body,
    )
