"""The simulated time of a replayed session's steps (``cache.idle`` in the replay config).

The recordings carry no timestamps, so each step comes ``step_seconds`` after the previous
one, and after a share of steps the session pauses for ``pause_seconds`` (a user reading an
answer, a CI run): which steps is a hash of the case and the step, so every arm of a case
meets the same pauses. The proxy gets each step's time in ``X-Compaction-Clock`` (its
``prompt_cache.clock: request``) and the cache simulation expires prefixes by it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from replay.config import IdleModel

# The header the proxy reads its clock from under ``prompt_cache.clock: request``.
CLOCK_HEADER = "x-compaction-clock"


def pauses_after(case_id: str, step: int, share: float) -> bool:
    """Whether the session pauses before this step (never before its first)."""
    if share <= 0:
        return False
    digest = hashlib.blake2b(f"{case_id}\x1f{step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < share


def step_times(case_id: str, steps: Sequence[int], idle: IdleModel) -> list[float]:
    """Each step's time in seconds from the session's start."""
    times: list[float] = []
    now = 0.0
    for position, step in enumerate(steps):
        if position:
            now += idle.step_seconds
            if pauses_after(case_id, step, idle.pause_share):
                now += idle.pause_seconds
        times.append(now)
    return times
