"""One proxied request: the facts gathered while it is served, for the observers.

The edge creates an ``Exchange`` per request; the route's steps, the relay and the read loop
fill it in; once the response is out, the finishing steps complete it (the token count a
model's answer reported), the edge seals it, and every observer (metrics, the compaction
event, the shadow comparison, the access log) reads the sealed record: none can change what
another reads, so their order does not matter.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from policies.pipeline import Offload, PolicyOutcome
from proxy.telemetry.tracing import RequestTrace


class ClientDisconnected(Exception):
    """The client went away; nothing more can be sent to it."""


@dataclass(slots=True)
class ShadowCompare:
    """A shadow request chosen for comparison: the compacted body, and the real answer."""

    body: dict[str, Any]
    url: str
    headers: list[tuple[bytes, bytes]]
    dialect: str
    target: Any = None  # what the request's path says (the dialect's ``Target``), if anything
    captured: bytearray = field(default_factory=bytearray)
    captured_sse: bool = False


@dataclass(slots=True)
class Exchange:
    request_id: str
    route: str  # a dialect name (chat, responses) or passthrough
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
    # Why the policy was not applied (a malformed history, NaN, a history held upstream).
    skipped: str | None = None
    # A request that forked a new session from another one (parent, messages shared, inherited).
    session_fork: dict[str, Any] | None = None
    # What the dialect noticed (e.g. the agent's own compaction request, items it keeps as sent).
    dialect_notes: dict[str, Any] = field(default_factory=dict)
    # For the compaction event, recorded once the response is out.
    outcome: PolicyOutcome | None = None
    tenant: str = ""
    session: str = ""
    model: object = None
    messages_before: int = 0
    messages_after: int = 0
    # At a compaction point, the view's messages that replace a client message with new text.
    view_changed: tuple[int, ...] = ()
    offloaded_bytes: int = 0
    reads: LoopResult | None = None
    compare: ShadowCompare | None = None
    # A model counted with a token factor (proxy/state/token_factors.py): the factor its view was
    # held to, and the head of a relayed answer, which reports the real prompt tokens.
    token_factor: float | None = None
    head_limit: int = 0
    answer_head: bytearray = field(default_factory=bytearray)
    answer_sse: bool = False
    # What the compaction event records about the count (the proxy's, estimated, reported).
    token_count: dict[str, Any] | None = None
    # Set just before the last body message: from then on a disconnect is the normal end.
    responded: bool = False
    extra_headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    # The request's trace (proxy/telemetry/tracing.py) when tracing is on, else None.
    trace: RequestTrace | None = None
    # Canary mode: the session's arm and key, what the relay kept of the answer, and the tool
    # calls of the agent's last step it had made before.
    arm: str | None = None
    canary_key: str = ""
    canary_capture: AnswerCapture | None = None
    repeats: int = 0
    # A request the upstream refused as over the model's window, sent again compacted to the
    # window its refusal named: what it said and what was done (for the event).
    context_retry: dict[str, Any] | None = None
    # The client's own X-Session-Id as it sent it (the event shows it beside the proxy's id).
    client_session: bytes | None = None
    # The compaction's own cost (proxy/telemetry/compaction_cost.py): the summarizer's tokens
    # of this point and of the session's preparations since its last request; None: none.
    compaction_cost: dict[str, Any] | None = None

    def mark_responded(self) -> None:
        self.responded = True

    def seal(self) -> None:
        """From now on a read-only record (``SealedExchange``): a write raises."""
        self.__class__ = SealedExchange


class SealedExchange(Exchange):
    """An ``Exchange`` once the response is out and its facts are complete: what observers get.
    (A class swap rather than a flag: the hot path's writes cost nothing extra.)"""

    __slots__ = ()

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"the request's record is sealed: {name} cannot change")


def new_request_id() -> str:
    return "cpx-" + os.urandom(12).hex()


def status_class(status: int) -> str:
    return f"{status // 100}xx" if status else "none"


def kept_for_event(outcome: PolicyOutcome) -> PolicyOutcome:
    """The outcome as the compaction event needs it once the request is forwarded: without the
    client's messages or the offloaded texts, and without the view and where its messages
    came from unless this request is a compaction point (whose event holds the view itself)."""
    # Built field by field: ``dataclasses.replace`` inspects the fields on every call, and
    # this runs once a request.
    point = bool(outcome.trigger)
    return PolicyOutcome(
        messages=outcome.messages if point else None,
        tokens_before=outcome.tokens_before,
        tokens_after=outcome.tokens_after,
        mechanisms=outcome.mechanisms,
        checkpoint=outcome.checkpoint,
        facts=outcome.facts,
        offloads={h: Offload(o.handle, "", o.description) for h, o in outcome.offloads.items()},
        original=(),
        trigger=outcome.trigger,
        origin=outcome.origin if point else None,
    )


@dataclass
class LoopResult:
    rounds: int = 0
    reads: list[str] = field(default_factory=list)  # outcome of each read: ok, truncated, not_found...
    usage_per_round: list[dict[str, Any]] = field(default_factory=list)
    # Prompt tokens of each request sent upstream, in the proxy's count.
    round_tokens: list[int] = field(default_factory=list)
    bytes_read: int = 0
    status: int = 0
    upstream_seconds: float = 0.0
    error: str | None = None
    # The last round's answer as the model wrote it (its items, in the dialect's shape).
    final_answer: list[Any] | None = None
    # Earlier read results shortened (their first lines kept, the exact arguments of the rest
    # given) to make room for a later answer's reads; withdrawn (replaced by a note naming
    # their handle) only when shortening was not enough and a later round could read them.
    shrunk: int = 0
    withdrawn: int = 0

    @property
    def largest_request(self) -> int:
        return max(self.round_tokens, default=0)


KEEP = 64 * 1024


@dataclass(slots=True)
class AnswerCapture:
    tool_marker: bytes
    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    tool_call: bool = False

    def take(self, chunk: bytes) -> None:
        # The first KEEP bytes, and the last KEEP (what does not fit the head goes to the tail,
        # so an answer written in one piece keeps its end: the usage).
        room = max(0, KEEP - len(self.head))
        self.head += chunk[:room]
        rest = chunk[room:]
        if rest:
            self.tail += rest
            if len(self.tail) > 2 * KEEP:
                del self.tail[:-KEEP]
        if not self.tool_call and self.tool_marker in chunk:
            self.tool_call = True

    def raw(self) -> bytes:
        return bytes(self.head) + bytes(self.tail[-KEEP:])
