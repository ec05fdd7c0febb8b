"""Model summaries prepared ahead, so a compaction point never waits for the summarizer.

Two moments start a preparation, each off the request path (queued fairly across tenants
under one bound per process, ``prepare_queue.py``, with the summarizer's timeout; a newer
preparation of a session replaces an older one):

- a request passes the ``prepare_at`` mark (a share of the window, below the high-water mark):
  the policy runs once more in the background, as if this request were a compaction point,
  and the summary request it would make (the range the next point covers, at this size) goes
  to the summarizer;
- a compaction point finds nothing ready: the ledger alone is used now, and this point's range
  is summarized for the next point.

At a compaction point a prepared summary is used at once if it is **checked**: it starts where
this summary starts and covers a prefix of its range with the same digests (no branch, no
edit since), it carries forward the model narrative the session's summary has now (not one
written before another point changed it: a replica's preparation landing late), it names no
saved-output handle and no file the ledger does not know, every
identifier it shares with the ledger is spelled as the ledger has it, and it fits the
summarizer's output budget. The steps after its end are in the ledger, which the stage
regenerates for the exact range and always appends. A summary that fails a check is dropped
and recorded (``prepared: rejected: <why>`` or ``stale`` in the event, and a metric).

A preparation pays with the credential of the request that started it (its summarizer's, see
credentials.py), and a prepared summary is served only to a request whose summary that same
credential would pay for (``payer``): one made with the operator's key never reaches a client
whose own key pays, nor the reverse.

Processes on one store (replicas on Redis, workers on one SQLite file) share what they prepare:
whichever serves the session's next point takes it from the store, once. A process's own copy
of what the store got is not used in its place (another process may have taken it, or put a
newer range there); it stands in only when the store is away or never got it. A point another
process served starts a new cycle in every process, and the first past the mark claims the
next point's preparation (``prepared_store.py``): the others leave it to that one.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from typing import Any

import orjson

from policies.pipeline import Checkpoint, PolicyOutcome
from policies.summarizer import Summarizer, SummaryRequest, SummaryResult
from proxy.summaries.prepare_queue import FairQueue
from proxy.summaries.prepared_checks import Prepared, check, decoded, lineage
from proxy.summaries.prepared_store import PreparedStore

# The payer of a summarizer that carries no credential of its own (a test's, the ledger).
KEYLESS = "-"


class PreparedSummaries:
    """The prepared summaries of this process's sessions, and the preparations running."""

    def __init__(
        self,
        *,
        max_tokens: int,
        count: Callable[[str], int],
        concurrency: int = 4,
        queue: int = 64,
        timeout: float = 60.0,
        max_sessions: int = 10_000,
        counted: Callable[[str], None] = lambda result: None,
        missed: Callable[[str], None] = lambda reason: None,
        depth: Callable[[int], None] = lambda queued: None,
        shared: PreparedStore | None = None,
        spent: Callable[[str, str, Any, int, int], None] = lambda tenant, session, whose, i, o: None,
    ) -> None:
        """``concurrency``: preparations in flight in this process, all tenants; ``queue``: per
        tenant waiting for a slot (``prepare_queue.py`` has the rules); ``missed(reason)``: a
        point found nothing ready, and why; ``depth(n)``: preparations waiting."""
        self.max_tokens = max_tokens
        self.count = count
        self.timeout = timeout
        self.max_sessions = max_sessions
        self.counted = counted
        self.missed = missed
        # The summarizer's tokens spent on preparations (used or not), with the tenant, session
        # and whose the preparation is (``whose``, as given to ``start``): the compaction's own
        # cost, recorded at once (proxy/telemetry/compaction_cost.py).
        self.spent = spent
        # Other processes on the same store (replicas on Redis, workers): what one prepares,
        # whichever serves the session's next point takes.
        self.shared = shared
        self.queue = FairQueue(
            concurrency=concurrency, per_tenant=queue, total=max_sessions, dropped=self._dropped, depth=depth
        )
        # Each session's summary this process made, and whether the shared store got it too.
        self._ready: OrderedDict[str, tuple[Prepared, bool]] = OrderedDict()
        self._tried: OrderedDict[str, int] = OrderedDict()
        # The session's compaction count when this process last served it: another process
        # served a point since when it changed (``_new_cycle``).
        self._cycle: OrderedDict[str, int] = OrderedDict()
        # Why a session's last preparation made nothing (dropped, failed): a miss's reason.
        self._lost: OrderedDict[str, str] = OrderedDict()
        self._dry_runs: dict[str, asyncio.Task[None]] = {}

    @property
    def tasks(self) -> set[asyncio.Task[None]]:
        return self.queue.tasks

    def running(self, session: str) -> bool:
        """A preparation of ``session`` waits for a slot or runs."""
        return self.queue.state(session) is not None

    def has(self, session: str) -> bool:
        return session in self._ready

    def start(
        self,
        tenant: str,
        session: str,
        request: SummaryRequest,
        summarizer: Summarizer,
        whose: Any = None,
    ) -> None:
        """Summarize ``request`` in the background for ``session`` (``whose``: what the request
        that started it says of its session, handed back with the tokens spent), when its turn
        comes (a newer range of the session replaces the one waiting or running: that one would
        be stale)."""
        self._lost.pop(session, None)

        def run() -> Coroutine[Any, Any, None]:
            return self._prepare(tenant, session, request, summarizer, whose)

        self.queue.submit(tenant, session, run)

    def _dropped(self, reason: str, session: str) -> None:
        """A preparation that will not run: ``dropped`` (its tenant's queue was full; a later
        miss of the session says so) or ``superseded`` (a newer range of its session)."""
        self.counted(reason)
        if reason == "dropped":
            self._lose(session, reason)

    def _lose(self, session: str, why: str) -> None:
        self._lost[session] = why
        self._lost.move_to_end(session)
        while len(self._lost) > self.max_sessions:
            self._lost.popitem(last=False)

    async def _prepare(
        self, tenant: str, session: str, request: SummaryRequest, summarizer: Summarizer, whose: Any
    ) -> None:
        try:
            result = await asyncio.wait_for(summarizer.summarize(request), self.timeout)
        except Exception:  # the ledger stands in, as for a summarizer failing at a point
            self._lose(session, "failed")
            self.counted("failed")
            return
        self.spent(tenant, session, whose, result.input_tokens, result.output_tokens)
        if result.fallback_reason is not None or not result.text.strip():
            self._lose(session, "failed")
            self.counted("failed")
            return
        payer = str(getattr(summarizer, "payer", KEYLESS))
        built_on = lineage(request.previous_summary)
        prepared = Prepared(request.covered[0], request.covered_digests, result, time.time(), payer, built_on)
        # Kept here only once the store has it: used here while on its way there, it would
        # land in the store afterwards, for another process's point to use again.
        stored = False
        if self.shared is not None:
            try:
                await self.shared.put(tenant, session, orjson.dumps(prepared))
                stored = True
            except Exception:  # this process still has it
                self.counted("unshared")
        self._ready[session] = (prepared, stored)
        self._ready.move_to_end(session)
        while len(self._ready) > self.max_sessions:
            self._ready.popitem(last=False)
        self.counted("prepared")

    def miss(self, session: str) -> str:
        """Why a point of ``session`` found nothing ready: its preparation is ``queued`` (waiting
        for a slot) or ``running``, was ``dropped`` (queue full) or ``failed``, or there was
        ``none`` (the point came before the mark, or what was made was taken or evicted)."""
        return self.queue.state(session) or self._lost.pop(session, None) or "none"

    async def take(
        self, tenant: str, session: str, request: SummaryRequest, payer: str = KEYLESS
    ) -> tuple[SummaryResult | None, str]:
        """The prepared summary standing for ``request``'s (this process's, else one another
        process prepared), or None and why. Taken: never used twice. ``payer``: the credential
        that would pay for this request's summary; one another credential paid for is not
        served."""
        self._tried.pop(session, None)  # a new cycle: the next mark prepares afresh
        prepared = await self._taken(tenant, session)
        if prepared is None:
            return None, "none_ready"
        if prepared.payer != payer or payer == "refused":
            return None, "rejected: prepared with another credential"
        why = check(prepared, request, self.max_tokens, self.count)
        if why is not None:
            return None, why
        return replace(prepared.result, prepared="used"), "used"

    async def _taken(self, tenant: str, session: str) -> Prepared | None:
        """The session's prepared summary, taken. What the shared store was given is the store's
        to give: another process may have taken it already (at a point it served) or put a newer
        range in its place, so this process's copy stands in only when the store is away, or
        never got it."""
        own, stored_too = self._ready.pop(session, (None, False))
        if self.shared is None:
            return own
        try:
            stored = await self.shared.take(tenant, session)
        except Exception:  # the store is away: this process's own, if any
            return own
        found = decoded(stored) if stored is not None else None
        if found is not None:
            return found
        return None if stored_too else own

    def after_request(
        self,
        tenant: str,
        session: str,
        outcome: PolicyOutcome,
        model: Summarizer,
        dry_run: Callable[[Checkpoint], Awaitable[SummaryRequest | None]],
        prepare_at: float,
        whose: Any = None,
    ) -> asyncio.Task[None] | None:
        """Past the prepare mark, between compaction points: the next point's summary request
        (a dry run of the policy, in the background) goes to the summarizer."""
        self._new_cycle(session, outcome.checkpoint.compactions)
        trigger = outcome.facts.trigger
        if trigger is None or outcome.trigger is not None:
            return None
        if trigger.request_tokens < prepare_at * trigger.window:
            return None
        if self.has(session) or self.running(session):
            return None
        # A dry run that found nothing to summarize is tried again only once the request has
        # grown by another 5% of the window (not on every step).
        tried = self._tried.get(session)
        if tried is not None and trigger.request_tokens < tried + 0.05 * trigger.window:
            return None
        self._tried[session] = trigger.request_tokens
        self._tried.move_to_end(session)
        while len(self._tried) > self.max_sessions:
            self._tried.popitem(last=False)
        checkpoint = outcome.checkpoint

        async def prepare() -> None:
            request = await dry_run(checkpoint)
            if request is None or not request.covered_digests or self.running(session):
                return
            if await self._claim(tenant, session, request):
                self.start(tenant, session, request, model, whose)

        task = asyncio.ensure_future(prepare())
        self._dry_runs[session] = task
        task.add_done_callback(
            lambda t: self._dry_runs.pop(session, None) if self._dry_runs.get(session) is t else None
        )
        return task

    async def _claim(self, tenant: str, session: str, request: SummaryRequest) -> bool:
        """Whether this process prepares ``request`` (past the mark): the first process on the
        store to claim the session's next point, from the narrative its summary has now, does
        (``prepared_store.py``); alone, or with the store away, this one does."""
        if self.shared is None:
            return True
        built_on = lineage(request.previous_summary)
        try:
            return await self.shared.claim(tenant, session, built_on, self.timeout)
        except Exception:  # the store is away: prepared here, as without one
            return True

    def _new_cycle(self, session: str, compactions: int) -> None:
        """A point of ``session`` served by another process (replicas, workers) since this one
        last saw it starts a new cycle here too: the size its last dry run was tried at is the
        old cycle's (larger than any request before the next point), and its copy of what it
        prepared, if the store got it, is the store's to give (``_taken``). Kept, either would
        stop this process preparing the next point's summary."""
        seen = self._cycle.get(session)
        self._cycle[session] = compactions
        self._cycle.move_to_end(session)
        while len(self._cycle) > self.max_sessions:
            self._cycle.popitem(last=False)
        if seen is None or seen == compactions:
            return
        self._tried.pop(session, None)
        if self._ready.get(session, (None, False))[1]:
            del self._ready[session]

    async def settle(self, session: str) -> None:
        """Wait for this session's preparation in flight (its dry run, then its summarizer
        call): what a replay asks for, so that its decisions are those of a live proxy whose
        agent steps take longer than the summarizer."""
        dry_run = self._dry_runs.get(session)
        if dry_run is not None:
            await asyncio.wait({dry_run}, timeout=self.timeout)
        job = self.queue.job(session)
        if job is not None:
            await asyncio.wait({job.done}, timeout=self.timeout)

    async def settle_all(self, session: str) -> None:
        """``settle`` every session kept under ``session`` (the proxy's id: one per policy,
        ``<session>:<policy>``), one after another: what the events API waits for when asked
        (``x-compaction-prepared: wait``), so that a replay reads every preparation's event."""
        prefix = session + ":"
        names = {*self._dry_runs, *self.queue.sessions()}
        for name in sorted(n for n in names if n == session or n.startswith(prefix)):
            await self.settle(name)

    async def drain(self) -> None:
        await self.queue.drain()


class NeverWaiting:
    """The summarizer a compaction point gets: the prepared summary when it passes the checks,
    else the ledger alone at once, and this range prepared for the next point."""

    def __init__(
        self,
        summaries: PreparedSummaries,
        tenant: str,
        session: str,
        model: Summarizer,
        wait: bool = False,
        may_prepare: bool = True,
        whose: Any = None,
    ) -> None:
        """``wait``: settle the session's preparation in flight first (the replay's header);
        ``may_prepare``: whether this point may prepare the next one (``answered.py``);
        ``whose``: what this request says of its session, for the preparations it starts."""
        self.whose = whose
        self.wait = wait
        self.may_prepare = may_prepare
        self.summaries = summaries
        self.tenant = tenant
        self.session = session
        self.model = model

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        if self.wait:
            await self.summaries.settle(self.session)
        payer = str(getattr(self.model, "payer", KEYLESS))
        used, why = await self.summaries.take(self.tenant, self.session, request, payer)
        self.summaries.counted(
            "stale" if why == "stale" else "rejected" if why.startswith("rejected") else why
        )
        if used is not None:
            return used
        state = self.summaries.queue.state(self.session)
        if why == "none_ready":
            self.summaries.missed(self.summaries.miss(self.session) if self.may_prepare else "unanswered")
        # A preparation running is kept (it covers a prefix of the next point's range); one
        # still waiting gives way to this point's range, newer and as cheap to make.
        if state != "running" and self.may_prepare:
            self.summaries.start(self.tenant, self.session, request, self.model, self.whose)
        return SummaryResult(text="", model="ledger", prompt_family="ledger", prepared=why)


class Capture:
    """A summarizer that only keeps the request a dry run of the policy would make."""

    def __init__(self) -> None:
        self.request: SummaryRequest | None = None

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.request = request
        return SummaryResult(text="", model="ledger", prompt_family="ledger")
