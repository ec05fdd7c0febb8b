"""Large requests are parsed, counted and compacted in worker processes, off the event loop.

A chat body of tens of megabytes, or of tens of thousands of messages, costs seconds of CPU
to parse, count and compact, most of it in C calls that hold the interpreter lock (a JSON
parser) or in Python loops; on the event loop that would stall every other client and
``/healthz`` for as long. Such bodies (over ``server.large_request_bytes``, decided on the
byte count before any parse; or with more than ``server.large_request_messages`` items in a
top-level list, decided on the parsed JSON: orjson reads a body under the byte limit in a few
milliseconds, and a scan of the raw bytes costs most of a parse on every request) go to a pool of
``server.large_request_workers`` processes instead. The parent keeps everything that holds
state (sessions, checkpoints, the store, the response), and sends the worker only the body and
what the policy needs; it gets back the view (as the body to send, which a policy brings down
to the model's window), the offloaded outputs, the next checkpoint and the figures.

The worker runs the same ``Policy.apply`` as the event loop would, with the same summarizer
configuration (its own HTTP client, its own circuit breakers).
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import msgspec

from policies.pipeline import (
    Checkpoint,
)
from policies.prompt_cache import PromptCache
from proxy.config.settings import Settings
from proxy.dialects.doors import Target
from proxy.route.large_worker import (
    Computed,
    Inspected,
    apply_in_worker,
    body_key,
    init_worker,
    inspect_in_worker,
    read_in_worker,
)
from proxy.state.store import encode_checkpoint
from proxy.summaries.credentials import SummaryCredential


class LargeRequests:
    """The pool, started on first use (most deployments never see a large request). Each
    worker is its own single-process executor: a request's two phases run in one process,
    which keeps the parsed body between them, so the body crosses to it only once."""

    def __init__(self, settings: Settings) -> None:
        server = settings.server
        self.max_bytes = server.large_request_bytes
        self.max_messages = server.large_request_messages
        self.workers = server.large_request_workers
        self._settings_json = msgspec.json.encode(settings)
        self._pools: list[ProcessPoolExecutor] = []
        self._slots: list[asyncio.Lock] = []
        self._queued: list[int] = []  # requests holding or waiting for each worker

    def wants(self, body: bytes) -> bool:
        """A body too large to parse on the event loop (its byte count)."""
        return len(body) > self.max_bytes

    def wants_parsed(self, data: Any) -> bool:
        """A parsed body whose history is too long to count and compact on the event loop
        (the longest top-level list: ``messages``, ``input``)."""
        if not isinstance(data, dict):
            return False
        return max((len(v) for v in data.values() if isinstance(v, list)), default=0) > self.max_messages

    def _start(self) -> None:
        if self._pools:
            return
        for _ in range(self.workers):
            self._pools.append(
                ProcessPoolExecutor(
                    max_workers=1,
                    # Not fork: this process runs threads (the store's, the event loop's helpers).
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=init_worker,
                    initargs=(self._settings_json,),
                )
            )
            self._slots.append(asyncio.Lock())
            self._queued.append(0)

    def worker(self) -> LargeWorker:
        """A worker for one request's two phases: the first free one, else the least busy."""
        self._start()
        index = min(range(len(self._pools)), key=lambda i: self._queued[i])
        self._queued[index] += 1

        def done() -> None:
            self._queued[index] -= 1

        return LargeWorker(self._pools[index], self._slots[index], done)

    def close(self) -> None:
        for pool in self._pools:
            pool.shutdown(wait=False, cancel_futures=True)
        self._pools, self._slots, self._queued = [], [], []


class LargeWorker:
    """One worker process, held for the two phases of one request."""

    def __init__(self, pool: ProcessPoolExecutor, slot: asyncio.Lock, done: Callable[[], None]) -> None:
        self.pool = pool
        self.slot = slot
        self.done = done
        self.key = b""

    async def __aenter__(self) -> LargeWorker:
        try:
            await self.slot.acquire()
        except BaseException:
            self.done()
            raise
        return self

    async def __aexit__(self, *_: object) -> None:
        self.slot.release()
        self.done()

    async def inspect(
        self,
        body: bytes,
        dialect: str,
        target: Target,
        tenant: str,
        with_digests: bool,
        headers: list[tuple[bytes, bytes]],
        restore: Callable[[list[Any]], Awaitable[Any]] | None = None,
    ) -> Inspected:
        """Phase one; with ``restore`` (the dialect's lookup, in this process), a phase zero
        first asks the worker what to look up, and what is found goes with phase one.
        ``target``: what the request's path says (the worker binds the adapter to it)."""
        self.key = body_key(body)
        loop = asyncio.get_running_loop()
        found = None
        if restore is not None:
            wanted = await loop.run_in_executor(self.pool, read_in_worker, body, dialect)
            if isinstance(wanted, Inspected):
                return wanted
            found = await restore(wanted) if wanted else None
        # Only the header an agent marks its compaction request with crosses to the worker.
        marks = [(k, v) for k, v in headers if k == b"x-codex-turn-metadata"]
        return await loop.run_in_executor(
            self.pool, inspect_in_worker, body, dialect, target, tenant, with_digests, marks, found
        )

    async def apply(
        self,
        *,
        policy: str,
        window: int,
        checkpoint: Checkpoint | None,
        injected_tokens: int,
        session: str,
        credential: SummaryCredential,
        skip: bool,
        cache: PromptCache | None = None,
    ) -> Computed:
        loop = asyncio.get_running_loop()
        encoded = encode_checkpoint(checkpoint) if checkpoint is not None else None
        return await loop.run_in_executor(
            self.pool,
            apply_in_worker,
            self.key,
            policy,
            window,
            encoded,
            injected_tokens,
            session,
            credential,
            skip,
            cache,
        )
