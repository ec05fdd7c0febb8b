"""When each session's prefix last went upstream: what tells a policy its cache is cold.

The proxy hands a policy a ``PromptCache`` (``policies/prompt_cache.py``) made from the time
since the session's previous request and its door's provider cache (``prompt_cache`` in the
config). Kept in this process's memory, bounded like the sessions (the oldest forgotten):

- ``clock: wall`` reads the monotonic clock; ``clock: request`` the request's
  ``X-Compaction-Clock`` header (a replay's simulated seconds; none: time-blind);
- a model whose prices the ``models`` table sets (``input_price`` with ``cached_input_price``
  and ``cache_write_price``) is priced by them: gpt-4.1's cache reads cost 0.25, gpt-5's 0.1,
  where the door's default says 0.5;
- with sessions shared between replicas (another process may have served the previous
  request) a session is never taken for cold: this process's last sight of it says nothing
  of the others'. The warm rules still apply (they assume the cache holds the prefix).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from policies.prompt_cache import PromptCache
from proxy.config.prompt_cache import PromptCacheSettings

# A model's cache read and write prices as shares of its input price (None: not set).
ModelShares = Callable[[object], tuple[float | None, float | None]]

CLOCK_HEADER = b"x-compaction-clock"


class PromptClock:
    def __init__(
        self,
        settings: PromptCacheSettings,
        max_sessions: int,
        shared: bool = False,
        now: Callable[[], float] = time.monotonic,
        model_shares: ModelShares | None = None,
    ) -> None:
        self.settings = settings
        self.max_sessions = max(1, max_sessions)
        self.shared = shared
        self.now = now
        self.model_shares = model_shares
        self._sent: OrderedDict[str, float] = OrderedDict()

    def observe(
        self, session: str, door: str, headers: Sequence[tuple[bytes, bytes]], model: object = None
    ) -> PromptCache | None:
        """The cache as this request of ``session`` finds it, the request taken as sent now."""
        if not self.settings.enabled or not session:
            return None
        now = self._time(headers)
        if now is None:
            return None
        last = self._sent.pop(session, None)
        self._sent[session] = now if last is None else max(now, last)
        while len(self._sent) > self.max_sessions:
            self._sent.popitem(last=False)
        idle = None if last is None or self.shared else max(0.0, now - last)
        provider = self.settings.for_door(door)
        read, write = self.model_shares(model) if self.model_shares is not None else (None, None)
        return PromptCache(
            idle_seconds=idle,
            ttl_seconds=provider.ttl_seconds,
            read_price=provider.read_price if read is None else min(read, 1.0),
            write_price=provider.write_price if write is None else max(write, 1.0),
        )

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
