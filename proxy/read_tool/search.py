"""``read_tool_output`` with handle ``*``: one pattern searched in every saved output of the
conversation at once.

A model rarely knows which of forty handles holds the line it needs (the first edit of a file,
what a test run printed); reading them one by one costs a round each and fills the window with
pages it did not want. The search runs the read's pattern (RE2, linear time) over the session's
saved outputs, newest first, and returns the matching lines of each output that has any, under
its handle, held to the room the round has and to the read's byte limit. What it could not
search for lack of room or time is named, so the model can go on by handle.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from policies.tokens import TokenCounter
from proxy.read_tool.tool import ReadArguments, ReadLimits, ReadResult, render
from proxy.state.store import Store

# Saved outputs one search covers: the newest of the session.
MAX_SEARCHED = 200
# Below this many tokens left, the search stops and names what it did not search.
_MIN_SECTION_TOKENS = 48


async def search_saved_outputs(
    store: Store,
    tenant: str,
    args: ReadArguments,
    handles: tuple[str, ...],
    *,
    limits: ReadLimits,
    timeout_seconds: float,
    room: int,
    counter: TokenCounter,
    encoding: str,
) -> ReadResult:
    """The matching lines of every saved output in ``handles`` (newest first), within ``room``."""
    newest = list(dict.fromkeys(reversed(handles)))[:MAX_SEARCHED]
    if not newest:
        return ReadResult("Error: this conversation has no saved outputs to search.", "not_found")
    deadline = time.monotonic() + timeout_seconds
    left_tokens, left_bytes = room - 40, limits.max_result_bytes
    sections: list[str] = []
    searched = 0
    unsearched: list[str] = []
    for position, handle in enumerate(newest):
        if left_tokens < _MIN_SECTION_TOKENS or left_bytes < 256 or time.monotonic() > deadline:
            unsearched += newest[position:]
            break
        try:
            stored = await store.get_output(tenant, handle)
        except Exception:  # the store is down: said in the header, the rest goes on
            unsearched.append(handle)
            continue
        if stored is None or stored.content is None:
            continue
        searched += 1
        one = ReadArguments(handle, pattern=args.pattern)
        read_limits = replace(limits, max_result_bytes=left_bytes)
        result = await asyncio.wait_for(
            asyncio.to_thread(
                render,
                handle,
                stored.content,
                one,
                limits=read_limits,
                budget_tokens=left_tokens,
                counter=counter,
                encoding=encoding,
            ),
            timeout=max(0.01, deadline - time.monotonic()),
        )
        if result.text.startswith(f"handle={handle}: 0 matching"):
            continue
        if result.lines_returned == 0:
            unsearched.append(handle)  # matches, but none fits what is left: named, not shown
            continue
        sections.append(result.text)
        left_tokens -= counter.count_text(result.text, encoding)
        left_bytes -= len(result.text.encode("utf-8", "replace"))
    header = f"Searched {searched} saved output(s) for the pattern: matches in {len(sections)}."
    if unsearched:
        named = ", ".join("handle=" + h for h in unsearched[:20])
        more = f" and {len(unsearched) - 20} more" if len(unsearched) > 20 else ""
        header += f" Not searched or not shown (no room or time left): {named}{more}; search them by handle."
    outcome = "truncated" if unsearched else "ok"
    return ReadResult("\n\n".join([header, *sections]), outcome)
