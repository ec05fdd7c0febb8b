"""Shadow comparison: would the compacted view have led the model to the same next decision?

In shadow mode the upstream answers the client's original request. With ``shadow.compare``, a
sampled share of requests whose view differs is also sent upstream in the background, as the
compacted view; that answer is never returned. The decision signatures of both answers (the
next action's tool and its normalized target, such as the path of an edit or the
command of a shell call, or "final answer") are compared and recorded in the request's
compaction event and in a divergence metric. Concurrency is bounded; a comparison that cannot
start is skipped, never queued.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

from policies.message_actions import actions_of

FINAL_ANSWER = "final answer"


def decision_signature(message: Any) -> str:
    """``tool: target`` of the first action in an assistant message, or "final answer"."""
    if not isinstance(message, dict):
        return FINAL_ANSWER
    actions = actions_of(message)
    if not actions:
        return FINAL_ANSWER
    return actions[0].signature


Ask = Callable[[dict[str, Any]], Awaitable[tuple[int, bytes]]]
# The decision signature of a raw answer (bytes, streamed or not): the dialect reads it.
Decide = Callable[[bytes, bool], str]


class ShadowComparer:
    def __init__(self, *, sample_rate: float, max_concurrent: int) -> None:
        self.sample_rate = sample_rate
        self._slots = asyncio.Semaphore(max_concurrent)
        self.tasks: set[asyncio.Task[None]] = set()

    def wanted(self) -> bool:
        return self.sample_rate > 0 and random.random() < self.sample_rate and not self._slots.locked()

    def start(
        self,
        ask: Ask,
        body: dict[str, Any],
        real_answer: bytes,
        real_is_sse: bool,
        done: Callable[[dict[str, Any]], None],
        decide: Decide,
    ) -> None:
        """``ask`` sends the compacted body upstream (reads answered as for a real request) and
        returns the final answer's status and JSON bytes; ``decide`` reads an answer's next
        decision in its wire format."""
        task = asyncio.create_task(self._compare(ask, body, real_answer, real_is_sse, done, decide))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _compare(
        self,
        ask: Ask,
        body: dict[str, Any],
        real_answer: bytes,
        real_is_sse: bool,
        done: Callable[[dict[str, Any]], None],
        decide: Decide,
    ) -> None:
        real = decide(real_answer, real_is_sse)
        result: dict[str, Any] = {"real": real, "shadow": None, "diverged": None, "error": None}
        try:
            async with self._slots:
                status, raw = await ask(
                    {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
                )
                if status != 200:
                    result["error"] = f"upstream answered HTTP {status}"
                else:
                    result["shadow"] = decide(raw, False)
                    result["diverged"] = result["shadow"] != real
        except Exception as exc:  # a failed comparison is recorded, never surfaced
            result["error"] = type(exc).__name__
        done(result)
