"""Handing freed heap memory back to the operating system (glibc only).

Each request parses and re-encodes bodies of up to hundreds of KB, while the token-count and
digest caches keep some of those texts for the session's next request. The long-lived texts
end up scattered between freed blocks, so glibc's heap keeps tens of MB of free pages that it
can only return with ``malloc_trim``: measured under load (benchmarks/RESULTS.md, "Load"),
it takes 1-5 ms and returns 25-65 MB.
"""

from __future__ import annotations

import asyncio
import ctypes
import sys
from collections.abc import Callable


def malloc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)``, or ``None`` where there is none (musl, macOS)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    return lambda: function(0)


async def trim_forever(trim: Callable[[], object], every: float) -> None:
    """Trim every ``every`` seconds, in a worker thread (ctypes releases the GIL), so the event
    loop keeps serving while glibc walks its heap."""
    while True:
        await asyncio.sleep(every)
        await asyncio.to_thread(trim)
