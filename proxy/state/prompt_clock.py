"""When each session's prefix last went upstream: what tells a policy its cache is cold.

The proxy hands a policy a ``PromptCache`` (``policies/prompt_cache.py``) made from the time
since the session's previous request and its door's provider cache (``prompt_cache`` in the
config). Kept in this process's memory, bounded like the sessions (the oldest forgotten):

- ``clock: wall`` reads the monotonic clock; ``clock: request`` the request's
  ``X-Compaction-Clock`` header (a replay's simulated seconds; none: time-blind);
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

CLOCK_HEADER = b"x-compaction-clock"


class PromptClock:
    def __init__(
        self,
        settings: PromptCacheSettings,
        max_sessions: int,
        shared: bool = False,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.max_sessions = max(1, max_sessions)
        self.shared = shared
        self.now = now
        self._sent: OrderedDict[str, float] = OrderedDict()

    def observe(self, session: str, door: str, headers: Sequence[tuple[bytes, bytes]]) -> PromptCache | None:
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
        return PromptCache(
            idle_seconds=idle,
            ttl_seconds=provider.ttl_seconds,
            read_price=provider.read_price,
            write_price=provider.write_price,
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
