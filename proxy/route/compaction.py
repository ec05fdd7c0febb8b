"""The compaction service: one request's view, whatever its wire format.

It takes the neutral conversation a dialect adapter read (a large body: the raw bytes, which a
worker process reads with the same adapter), finds its session (``X-Session-Id``, else the one
whose requests it extends), and under the session's lock loads its checkpoint (or a fork's
parent's), applies the policy, stores what was offloaded before a view naming it can be sent,
and keeps the next checkpoint. It knows no wire format and writes no response.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from policies.digests import Digests
from policies.pipeline import Checkpoint, Policy, PolicyOutcome
from policies.summarizer import SummaryRequest
from policies.tokens import TokenCounter
from proxy.route.known_bodies import KnownBodies
from proxy.route.known_prefix import KnownPrefixes
from proxy.route.large_requests import LargeRequests
from proxy.route.session_checkpoints import SessionCheckpoints
from proxy.state.prompt_clock import PromptClock
from proxy.state.session_index import Resolution
from proxy.state.sessions import MemorySessions, root_session
from proxy.state.store import Store
from proxy.state.token_factors import ScaledWindows
from proxy.summaries.answered import AnsweredTenants
from proxy.summaries.credentials import SummaryCredential
from proxy.summaries.prepared import Capture, NeverWaiting, PreparedSummaries
from proxy.summaries.summarizer import OpenAISummarizer
from proxy.telemetry.compaction_cost import PreparedFor
from proxy.telemetry.metrics import Metrics
from proxy.wire.forwarding import header_value

Headers = list[tuple[bytes, bytes]]
# A provider's scheme, host and port.
Origin = tuple[str, str, int]
# The header a provider gets for a client that sends no credential (the operator's key).
Fallback = tuple[bytes, bytes]


@dataclass(slots=True)
class Compacted:
    """What the service did for one request."""

    outcome: PolicyOutcome
    session: str
    messages: int  # the client's messages (neutral)
    model: Any  # the model the request is for
    view_body: dict[str, Any] | None = None  # a large request's view, as its worker wrote it
    session_fork: dict[str, Any] | None = None
    skipped: str | None = None
    stream: bool = False
    notes: dict[str, Any] = field(default_factory=dict)
    marked: bool = False  # a large body's lone surrogates stand as marks in its view
    # Whose its preparations are (its canary arm, policy, door...): for their own events.
    whose: PreparedFor | None = None


def policy_reserve(policy: Policy) -> int:
    """The answer reserve the policy's token safeguard keeps (1024 without one)."""
    for stage in policy.stages:
        if stage.name == "token_safeguard":
            return int(getattr(stage, "reserve_tokens", 1024))
    return 1024


def without_stages(policy: Policy) -> Policy:
    return Policy(name=policy.name, description=policy.description, stages=())


class CompactionService:
    def __init__(
        self,
        *,
        counter: TokenCounter,
        windows: ScaledWindows,
        store: Store,
        sessions: MemorySessions,
        metrics: Metrics,
        summarizer: OpenAISummarizer | None,
        large: LargeRequests,
        record_skipped: bool,
        max_sessions: int,
        injected_tokens: Callable[[str], int],
        known_prefix_tokens: int = 8 * 1024 * 1024,
        prepared: PreparedSummaries | None = None,
        prepare_at: float | None = None,
        answered: AnsweredTenants | None = None,
        clock: PromptClock | None = None,
    ) -> None:
        """``injected_tokens(encoding)``: what the proxy adds to a view that names a saved
        output (the read tool's schema), kept free by the token safeguard."""
        self.counter = counter
        self.windows = windows
        self.store = store
        self.sessions = sessions
        self.metrics = metrics
        self.summarizer = summarizer
        self.large = large
        self.record_skipped = record_skipped
        self.injected_tokens = injected_tokens
        self.digests = Digests(counter=counter)
        self.known = KnownPrefixes(max_conversations=max_sessions, max_tokens=known_prefix_tokens)
        self.bodies = KnownBodies(max_bodies=max_sessions, max_bytes=4 * known_prefix_tokens)
        self.background: set[asyncio.Task[None]] = set()
        self.checkpoints = SessionCheckpoints(sessions, store, metrics, max_sessions, self.background)
        # Model summaries prepared ahead (summarizer.prepare_at): a compaction point never waits.
        self.prepared = prepared if summarizer is not None and prepare_at is not None else None
        self.prepare_at = prepare_at or 1.0
        # The tenants the upstream has answered in this process (None: every tenant may prepare).
        self.answered = answered
        # When each session's prefix last went upstream (None: every policy is time-blind).
        self.clock = clock

    def may_prepare(self, tenant: str, model: Any) -> bool:
        """Whether work no client waits for may be spent on this tenant: always with its own
        credential (the provider checks it); with a keyless summarizer (the operator's
        capacity), only once the upstream has answered the tenant (``answered.py``)."""
        keyless = bool(getattr(model, "keyless", False))
        return self.answered is None or not keyless or tenant in self.answered

    def keeps_session_state(self, policy: Policy) -> bool:
        # A checkpoint belongs to one policy: switching policies mid-session starts afresh.
        # A policy without stages keeps no session state: named only if its events are recorded.
        return bool(policy.stages) or self.record_skipped

    def credential(
        self, headers: Headers, client_origin: Origin | None, fallback: Fallback | None
    ) -> SummaryCredential:
        """What pays for this client's summary: the credential its own request uses upstream
        (its own, only at the provider it addressed; the operator's only for a client that
        sends none, where the operator's key is what that provider gets). See credentials.py."""
        if self.summarizer is None:
            return SummaryCredential()
        return self.summarizer.credential_for(headers, client_origin, fallback)

    async def compact(
        self,
        neutral: dict[str, Any],
        *,
        policy: Policy,
        tenant: str,
        headers: Headers,
        skipped: str | None,
        client_origin: Origin | None = None,
        counter: TokenCounter | None = None,
        fallback: Fallback | None = None,
        door: str = "chat",
        force: bool = False,
        whose: PreparedFor | None = None,
    ) -> Compacted:
        """A request of ordinary size, compacted on the event loop. ``client_origin``: the
        scheme, host and port of the provider the client's request addressed (its credential
        is for that upstream only); ``fallback``: what that provider gets for a client that
        sends no credential. ``counter``: the request's own (``for_request``); ``force``: a
        compaction point whatever its size (a client asked for one: ``compact_answer.py``)."""
        counter = counter or self.counter
        encoding = counter.encoding_for(neutral.get("model"))
        if not counter.is_loaded(encoding):
            # Another model family's encoding: loaded once, off the event loop.
            await asyncio.to_thread(counter.warm_up, [encoding])
        effective = without_stages(policy) if skipped else policy
        messages = neutral["messages"]
        resolution = None
        digests = self.digests.for_request()
        explicit = header_value(headers, b"x-session-id")
        # The session the conversation's root names, when the client names none (a scan of
        # every message, so not made when it does).
        root = "" if explicit else root_session(neutral, tenant)
        # The conversation's last request: its known prefix is neither counted nor digested
        # again, whatever the policy (a pass-through request is counted for its metrics too).
        known_key = f"{tenant}\x1f{explicit.decode('latin-1')}" if explicit else root
        adopted = self.known.adopt(known_key, messages, encoding, counter, digests)
        if self.keeps_session_state(effective):
            resolution = await self.checkpoints.resolve(
                headers, root, tenant, policy.name, [] if explicit else [digests.message(m) for m in messages]
            )
        session = resolution.session + ":" + policy.name if resolution else ""
        window = self.windows.window_for(neutral.get("model"))
        injected = self.injected_tokens(encoding)

        async def compute(checkpoint: Checkpoint | None, summarizer: Any, **options: Any) -> PolicyOutcome:
            """``options``: ``prepare`` (a dry run), ``cache`` (the provider's prompt cache)."""
            return await effective.apply(
                neutral,
                counter,
                window=window,
                checkpoint=checkpoint,
                summarizer=summarizer,
                digests=digests,
                injected_tokens=injected,
                force=force,
                **options,
            )

        async def dry_run(checkpoint: Checkpoint) -> SummaryRequest | None:
            """The summary request this request would make, were it a compaction point."""
            capture = Capture()
            await compute(checkpoint, capture, prepare=True)
            return capture.request

        compacted = Compacted(
            outcome=PolicyOutcome(None, 0, 0),
            session=session,
            messages=len(messages),
            model=neutral.get("model"),
            skipped=skipped,
            whose=whose,
        )
        paid = self.credential(headers, client_origin, fallback)
        compacted.outcome = await self.apply(
            effective, headers, tenant, session, resolution, compacted, compute, paid, dry_run, door=door
        )
        self.known.keep(known_key, messages, adopted, encoding, counter, digests, compacted.outcome.messages)
        return compacted

    async def apply(
        self,
        policy: Policy,
        headers: Headers,
        tenant: str,
        session: str,
        resolution: Resolution | None,
        compacted: Compacted,
        compute: Callable[..., Awaitable[PolicyOutcome]],
        credential: SummaryCredential,
        dry_run: Callable[[Checkpoint], Awaitable[SummaryRequest | None]] | None = None,
        door: str = "chat",
    ) -> PolicyOutcome:
        """Run ``compute`` (the policy, here or in a worker process) under the session's lock,
        from its checkpoint; store what it offloaded and keep its next checkpoint.
        ``credential``: what pays for this client's summaries, prepared ones too."""
        if not policy.stages:
            return await compute(None, None)
        async with self.sessions.lock(session):
            checkpoint = self.sessions.checkpoint(session)
            if checkpoint is None:
                checkpoint = await self.checkpoints.load(tenant, session)
            if checkpoint is None and resolution is not None:
                checkpoint, compacted.session_fork = await self.checkpoints.inherited(
                    tenant, resolution, policy.name
                )
            summarizer: Any = self.summarizer.for_session(session, credential) if self.summarizer else None
            model = summarizer
            # No credential of this client's may pay: nothing is prepared for it either.
            prepared = self.prepared if model is not None and model.payable else None
            may_prepare = self.may_prepare(tenant, model)
            whose = replace(compacted.whose or PreparedFor(), model=compacted.model)
            if prepared is not None:
                # A replay asks a point to settle the preparation in flight (deterministic).
                wait = header_value(headers, b"x-compaction-prepared") == b"wait"
                summarizer = NeverWaiting(prepared, tenant, session, model, wait, may_prepare, whose)
            # The cache as this request finds it (the previous request's time, then this one's).
            clock = self.clock
            cache = await clock.observe(tenant, session, door, headers, compacted.model) if clock else None
            outcome = await compute(checkpoint, summarizer, cache=cache)
            if prepared is not None and dry_run is not None and may_prepare:
                task = prepared.after_request(
                    tenant, session, outcome, model, dry_run, self.prepare_at, whose
                )
                if task is not None:
                    self.background.add(task)
                    task.add_done_callback(self.background.discard)
            if outcome.offloads:
                try:
                    # Durably stored before any view naming the handles is sent.
                    await self.store.put_outputs(tenant, list(outcome.offloads.values()))
                except Exception:  # fail open: the client's own request goes through
                    self.metrics.errors.labels("store_write").inc()
                    compacted.view_body = None
                    return PolicyOutcome(
                        None,
                        outcome.tokens_before,
                        outcome.tokens_before,
                        checkpoint=checkpoint or Checkpoint(),
                    )
            self.sessions.save(session, outcome.checkpoint)
            # The request counter changes on every request; only other changes are worth a write.
            changed = checkpoint is None or not outcome.checkpoint.same_but_requests(checkpoint)
            if changed and outcome.mechanisms:
                await self.checkpoints.keep(tenant, session, outcome.checkpoint)
        return outcome
