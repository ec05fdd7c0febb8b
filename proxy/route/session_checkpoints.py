"""Which session a request continues, and the checkpoint it continues from.

A request's session is the client's ``X-Session-Id``, else the session whose requests it
extends (the branch index: in this process, or in the store when other processes serve the
same sessions). Its checkpoint is in memory, else in the store, else (a fork) its parent's
when everything that checkpoint decided lies in the messages they share. A changed checkpoint
is written back: at once when another process may serve the next request, else in the
background. A store that fails costs one fresh compaction, never the request.
"""

from __future__ import annotations

import asyncio
from typing import Any

from policies.pipeline import Checkpoint
from proxy.state.session_index import BranchIndex, Resolution
from proxy.state.sessions import MemorySessions, explicit_session
from proxy.state.store import Store
from proxy.telemetry.metrics import Metrics
from proxy.wire.forwarding import header_value

Headers = list[tuple[bytes, bytes]]


class SessionCheckpoints:
    def __init__(
        self,
        sessions: MemorySessions,
        store: Store,
        metrics: Metrics,
        max_sessions: int,
        background: set[asyncio.Task[None]],
    ) -> None:
        self.sessions = sessions
        self.store = store
        self.metrics = metrics
        self.branches = BranchIndex(max_sessions)
        # The service's background tasks: awaited at shutdown with the others.
        self.background = background

    async def resolve(
        self, headers: Headers, root: str, tenant: str, policy: str, digests: list[str]
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

    async def inherited(
        self, tenant: str, resolution: Resolution, policy: str
    ) -> tuple[Checkpoint | None, dict[str, Any] | None]:
        """A fork starts from its parent's checkpoint when everything that checkpoint decided
        lies in the messages they share (a summary never covers what the fork does not have).
        Returns that checkpoint (or None) and what the event says of the fork."""
        if resolution.parent is None:
            return None, None
        parent = f"{resolution.parent}:{policy}"
        checkpoint = self.sessions.checkpoint(parent) or await self.load(tenant, parent)
        inherited = checkpoint is not None and (
            checkpoint.summary is None or checkpoint.summary_at + checkpoint.covered <= resolution.common
        )
        fork = {"parent": parent, "common_messages": resolution.common, "inherited": inherited}
        return (checkpoint if inherited else None), fork

    async def load(self, tenant: str, session: str) -> Checkpoint | None:
        try:
            return await self.store.load_checkpoint(tenant, session)
        except Exception:  # a missing checkpoint only costs one fresh compaction
            self.metrics.errors.labels("store_read").inc()
            return None

    async def save(self, tenant: str, session: str, checkpoint: Checkpoint) -> None:
        try:
            await self.store.save_checkpoint(tenant, session, checkpoint)
        except Exception:  # a lost checkpoint costs one fresh compaction, never the request
            self.metrics.errors.labels("store_write").inc()

    async def keep(self, tenant: str, session: str, checkpoint: Checkpoint) -> None:
        """A changed checkpoint: written now when another worker may serve this session's next
        request, else in the background (memory stays authoritative in this process; the store
        lets a restarted or another replica continue the session)."""
        if self.sessions.shared:
            await self.save(tenant, session, checkpoint)
            return
        task = asyncio.create_task(self.save(tenant, session, checkpoint))
        self.background.add(task)
        task.add_done_callback(self.background.discard)
