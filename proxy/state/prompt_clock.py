"""When each session's prefix last went upstream: what tells a policy its cache is cold.

The proxy hands a policy a ``PromptCache`` (``policies/prompt_cache.py``) made from the time
since the session's previous request and its door's provider cache (``prompt_cache`` in the
config). Kept in this process's memory, bounded like the sessions (the oldest forgotten):

- ``clock: wall`` reads the monotonic clock; ``clock: request`` the request's
  ``X-Compaction-Clock`` header (a replay's simulated seconds; none: time-blind);
- a model whose prices the ``models`` table sets (``input_price`` with ``cached_input_price``
  and ``cache_write_price``) is priced by them: gpt-4.1's cache reads cost 0.25, gpt-5's 0.1,
  where the door's default says 0.5;
- with sessions shared between replicas on Redis (another one may have served the previous
  request), the last send is the store's (``Store.swap_sent_at``: one command a request; the
  wall clock is then the epoch time, the same on every machine within its skew); a store
  that fails makes the request time-blind, never fails it. Worker processes on one SQLite
  file take no session for cold (a write a request would queue behind the store's others).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from policies.prompt_cache import PromptCache
from proxy.config.prompt_cache import PromptCacheSettings
from proxy.state.store import Store

# A model's cache read and write prices as shares of its input price (None: not set).
ModelShares = Callable[[object], tuple[float | None, float | None]]

CLOCK_HEADER = b"x-compaction-clock"


class PromptClock:
    def __init__(
        self,
        settings: PromptCacheSettings,
        max_sessions: int,
        shared: Store | None = None,
        now: Callable[[], float] | None = None,
        model_shares: ModelShares | None = None,
        unshared_peers: bool = False,
    ) -> None:
        """``shared``: the store of sessions that other processes serve too (None: this
        process remembers their last sends itself). ``unshared_peers``: other processes serve
        the same sessions but the store keeps no last sends for them (worker processes on one
        SQLite file: a write a request would queue behind the store's other writes), so no
        session is taken for cold."""
        self.settings = settings
        self.max_sessions = max(1, max_sessions)
        self.shared = shared
        self.now = now or (time.time if shared is not None else time.monotonic)
        self.model_shares = model_shares
        self.unshared_peers = unshared_peers
        self._sent: OrderedDict[str, float] = OrderedDict()

    async def observe(
        self,
        tenant: str,
        session: str,
        door: str,
        headers: Sequence[tuple[bytes, bytes]],
        model: object = None,
    ) -> PromptCache | None:
        """The cache as this request of ``session`` finds it, the request taken as sent now."""
        if not self.settings.enabled or not session:
            return None
        now = self._time(headers)
        if now is None:
            return None
        if self.shared is not None:
            try:
                last = await self.shared.swap_sent_at(tenant, session, now)
            except Exception:  # fail open: time-blind, the request goes on
                return None
        else:
            last = None if self.unshared_peers else self._swap(session, now)
        idle = None if last is None else max(0.0, now - last)
        provider = self.settings.for_door(door)
        read, write = self.model_shares(model) if self.model_shares is not None else (None, None)
        return PromptCache(
            idle_seconds=idle,
            ttl_seconds=provider.ttl_seconds,
            read_price=provider.read_price if read is None else min(read, 1.0),
            write_price=provider.write_price if write is None else max(write, 1.0),
        )

    def _swap(self, session: str, now: float) -> float | None:
        last = self._sent.pop(session, None)
        self._sent[session] = now if last is None else max(now, last)
        while len(self._sent) > self.max_sessions:
            self._sent.popitem(last=False)
        return last

    def _time(self, headers: Sequence[tuple[bytes, bytes]]) -> float | None:
        if self.settings.clock == "wall":
            return self.now()
        for name, value in headers:
            if name == CLOCK_HEADER:
                try:
                    seconds = float(value)
                except ValueError:
                    return None
                return seconds if seconds == seconds and abs(seconds) != float("inf") else None
        return None
