"""Preparations waiting for the summarizer, served fairly across tenants.

The rules, and why:

- **One bound per process** (``summarizer.prepare_concurrency``) on preparations in flight: the
  summarizer's rate is the scarce thing, shared by every tenant.
- **A queue per tenant, served round-robin.** A first-come queue serves one tenant's 300
  sessions before another tenant's one (a 2 s summarizer, 2 in flight: 150 s), and that
  tenant's point finds nothing ready. Round-robin bounds its wait by the number of tenants
  waiting, not by the number of sessions queued ahead of it.
- **Newest first within a tenant.** Under a backlog the oldest waiting ranges are the likeliest
  to have met their point already (which then queues its own, newer range); serving the newest
  keeps what is made useful.
- **One preparation per session.** A newer range of a session replaces the one waiting (or
  running: the older range would be stale at the point) instead of queueing beside it.
- **Bounded waiting**: at most ``summarizer.prepare_queue`` per tenant and ``total`` in all; past
  that the oldest waiting one of the tenant (in all: of the longest queue) is dropped, counted.

Nothing here runs per request: only a session past its mark, or a point that found nothing
ready, submits; each step is O(1) but the rare drop past ``total`` (O(tenants)).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

Run = Callable[[], Coroutine[Any, Any, None]]


@dataclass(eq=False, slots=True)
class Job:
    tenant: str
    session: str
    run: Run
    # Settled when the job ends, however (made, failed, dropped, replaced): what settle waits on.
    done: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    task: asyncio.Task[None] | None = None


class FairQueue:
    """The preparations of this process: waiting per tenant, and at most ``concurrency`` running."""

    def __init__(
        self,
        *,
        concurrency: int,
        per_tenant: int,
        total: int,
        dropped: Callable[[str, str], None] = lambda reason, session: None,
        depth: Callable[[int], None] = lambda queued: None,
    ) -> None:
        """``dropped(reason, session)``: a job that will not run (``dropped``: queue full; ``superseded``:
        a newer range of its session); ``depth(n)``: the jobs waiting, after each change."""
        self.concurrency = concurrency
        self.per_tenant = per_tenant
        self.total = total
        self.dropped = dropped
        self.depth = depth
        self._jobs: dict[str, Job] = {}  # each session's current job, waiting or running
        self._queues: dict[str, OrderedDict[str, Job]] = {}  # by tenant, oldest first
        self._turns: deque[str] = deque()  # tenants with a turn to come, in order
        self._in_turns: set[str] = set()
        self._queued = 0
        self.in_flight = 0
        self.tasks: set[asyncio.Task[None]] = set()

    def state(self, session: str) -> Literal["queued", "running"] | None:
        job = self._jobs.get(session)
        if job is None:
            return None
        return "queued" if job.task is None else "running"

    def job(self, session: str) -> Job | None:
        return self._jobs.get(session)

    def sessions(self) -> list[str]:
        """The sessions with a job waiting or running."""
        return list(self._jobs)

    @property
    def queued(self) -> int:
        return self._queued

    def submit(self, tenant: str, session: str, run: Run) -> Job:
        """Queue ``run`` for ``session``, replacing its job waiting or running."""
        previous = self._jobs.pop(session, None)
        if previous is not None:
            self._remove(previous, "superseded")
        job = Job(tenant, session, run)
        self._jobs[session] = job
        queue = self._queues.get(tenant)
        if queue is None:
            queue = self._queues[tenant] = OrderedDict()
        if tenant not in self._in_turns:
            self._turns.append(tenant)
            self._in_turns.add(tenant)
        queue[session] = job
        self._queued += 1
        if len(queue) > self.per_tenant:
            self._drop_oldest(queue)
        elif self._queued > self.total:
            self._drop_oldest(max(self._queues.values(), key=len))
        self._dispatch()
        return job

    def _drop_oldest(self, queue: OrderedDict[str, Job]) -> None:
        oldest = next(iter(queue.values()))
        del self._jobs[oldest.session]
        self._remove(oldest, "dropped")

    def _remove(self, job: Job, reason: str | None) -> None:
        """``job`` will not run (or finish): out of its queue, or its task cancelled; counted
        under ``reason`` (None: shutdown, not counted)."""
        if reason is not None:
            self.dropped(reason, job.session)
        if job.task is not None:
            job.task.cancel()  # _finished frees its slot
            return
        queue = self._queues.get(job.tenant)
        if queue is not None and queue.pop(job.session, None) is job:
            self._queued -= 1
            if not queue:
                del self._queues[job.tenant]  # its turn, if any, is skipped when it comes
        if not job.done.done():
            job.done.set_result(None)

    def _dispatch(self) -> None:
        """Start jobs while slots are free: the next tenant's turn, its newest job."""
        while self.in_flight < self.concurrency and self._turns:
            tenant = self._turns.popleft()
            self._in_turns.discard(tenant)
            queue = self._queues.get(tenant)
            if not queue:
                continue
            _, job = queue.popitem(last=True)
            self._queued -= 1
            if queue:
                self._turns.append(tenant)
                self._in_turns.add(tenant)
            else:
                del self._queues[tenant]
            self.in_flight += 1
            job.task = task = asyncio.ensure_future(job.run())
            self.tasks.add(task)
            task.add_done_callback(partial(self._finished, job))
        self.depth(self._queued)

    def _finished(self, job: Job, _task: object = None) -> None:
        assert job.task is not None
        self.tasks.discard(job.task)
        if not job.task.cancelled():
            job.task.exception()  # retrieved: a job's own failures are counted by the job
        self.in_flight -= 1
        if self._jobs.get(job.session) is job:
            del self._jobs[job.session]
        if not job.done.done():
            job.done.set_result(None)
        self._dispatch()

    async def idle(self) -> None:
        """Wait until nothing waits or runs (tests, benchmarks)."""
        while self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)

    async def drain(self) -> None:
        """Drop what waits, cancel what runs (shutdown)."""
        for queue in list(self._queues.values()):
            for job in list(queue.values()):
                self._remove(job, None)
        self._jobs.clear()
        self._turns.clear()
        self._in_turns.clear()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.depth(self._queued)
