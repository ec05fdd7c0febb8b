"""One compacting request while the route's steps prepare it (``Draft``), the signature every
step has (``Step``: a draft in, go on or not), and what the steps ask of a body before they
read it (a stream of several choices; why a body could not be read)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from policies.pipeline import Policy
from policies.tokens import TokenCounter
from proxy.dialects.base import Dialect, Parsed
from proxy.dialects.doors import BODY_SAYS, Target
from proxy.read_loop.runner import LoopPlan
from proxy.route.compaction import Compacted
from proxy.route.known_bodies import KnownBody
from proxy.telemetry.exchange import Exchange
from proxy.upstream.providers import Provider
from proxy.wire.json_body import SentAsIs

Send = Callable[[dict[str, Any]], Awaitable[None]]


Headers = list[tuple[bytes, bytes]]


# Bytes of a relayed answer kept to read the prompt tokens it reports (a stream reports them in
# its first event; a JSON answer at its end).
HEAD_LIMIT = 256 * 1024


@dataclass(slots=True)
class Draft:
    """One request while the route's steps prepare it."""

    dialect: Dialect
    provider: Provider
    headers: Headers  # the client's
    url: str
    exchange: Exchange
    content: bytes  # what goes upstream: the client's bytes until a view replaces them
    route_headers: Headers = field(default_factory=list)
    policy: Policy | None = None
    mode: str = "off"
    tenant: str = ""
    parsed: Parsed | None = None
    skipped: str | None = None
    compacted: Compacted | None = None
    view: dict[str, Any] | None = None  # the view as the dialect's wire body
    loop: LoopPlan | None = None  # set when the read loop serves the request
    # The body as the dialect's ``restore`` hook put it back (None: as the client sent it).
    restored: dict[str, Any] | None = None
    # The request's counter: each message is counted once however often it is asked for.
    counter: TokenCounter | None = None
    wire: KnownBody | None = None  # the client's body as read (what is known of its items)
    # The body's lone surrogates stand as marks: every body written upstream is unmarked.
    marked: bool = False
    # What the request's path says (a Gemini door's model and stream); ``dialect`` is bound to it.
    target: Target = BODY_SAYS

    def as_sent(self, why: str) -> bool:
        """The request goes exactly as the client sent it; the header says why."""
        self.exchange.skipped = why
        self.route_headers.append((b"x-compaction-skipped", why.encode("ascii", "replace")))
        return False


Step = Callable[[Draft], Awaitable[bool]]


def restore_lookup(draft: Draft) -> Callable[[list[Any]], Awaitable[Any]] | None:
    """The dialect's lookup for a worker that reads a large body, if it could find anything."""
    dialect, tenant = draft.dialect, draft.tenant
    if not dialect.restores():
        return None

    async def lookup(wanted: list[Any]) -> Any:
        return await dialect.restore_found(tenant, wanted)

    return lookup


def several_streamed_choices(body: dict[str, Any]) -> bool:
    """A stream of ``n`` > 1 choices: the read tool is not offered (each choice would need its
    own read rounds inside one interleaved stream); the view still names its handles."""
    n = body.get("n")
    return body.get("stream") is True and isinstance(n, int) and not isinstance(n, bool) and n > 1


# What an adapter raises on a shape it cannot read (a wrong type deep in an item, nesting past
# the serializer's limit).
UNREADABLE = (TypeError, ValueError, KeyError, AttributeError, IndexError, RecursionError)


def why_unreadable(dialect: str, exc: BaseException) -> str:
    if isinstance(exc, SentAsIs):
        return exc.reason
    return f"unreadable {dialect} body ({type(exc).__name__})"
