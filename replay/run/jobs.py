"""``replay run --jobs N``: the (arm, case) pairs of a run split over N worker processes.

Each worker is a process of its own with its own recorded upstream and its own proxy (config,
log and state in ``DIR/worker-<n>/``), so the harness's Python and the proxies use every core.
The split is deterministic: cases, each with all its pending arms, largest first by the bytes
their requests carry, go to the worker with the least work so far. A pair is replayed whole
by one worker, in one proxy session, exactly as ``--jobs 1`` replays it; each worker saves its
parts in the run directory (``DIR/parts``) and the run builds its results from them as it does
after ``--jobs 1``. Workers are started with ``spawn`` (no state copied from the run's process)
and stopped with SIGTERM, on which they stop their proxies.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import queue
import resource
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

import orjson

from replay.recording.cases import Case
from replay.run.loading import Loaded, only_cases
from replay.run.parts import WorkItem
from replay.run.replayer import Replayed, RunOptions, replay_items

# What a worker reports: ("steps", worker, count), ("done", worker, what it did) or
# ("failed", worker, traceback).
Report = tuple[str, int, Any]
STOP_SECONDS = 30.0


class WorkerFailed(RuntimeError):
    pass


@dataclass(slots=True)
class WorkersDone:
    unexpected_upstream_requests: int
    # Per worker: its number, pairs, steps, seconds, CPU seconds of its Python and of its
    # proxy, and unexpected upstream requests.
    workers: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class WorkerTask:
    number: int  # 1-based
    options: RunOptions
    loaded: Loaded  # the cases of its pairs only
    items: tuple[WorkItem, ...]


def replay_cost(case: Case) -> int:
    """Bytes the case's step requests carry: a message is sent again with every later step."""
    steps = sorted(case.steps)
    cost = 0
    passed = 0  # steps at or before the current message
    for index, message in enumerate(case.messages):
        while passed < len(steps) and steps[passed] <= index:
            passed += 1
        cost += len(orjson.dumps(message)) * (len(steps) - passed + 1)
    return cost


def split_items(items: Sequence[WorkItem], jobs: int) -> list[list[WorkItem]]:
    """``items`` over at most ``jobs`` workers: each case with all its arms (the texts the
    arms share are counted once by the worker's proxy), largest first to the least loaded
    worker; the same split for the same items, each share in the order of ``items``."""
    by_case: dict[str, list[int]] = {}
    for position, item in enumerate(items):
        by_case.setdefault(item.case.case_id, []).append(position)
    costs = {
        case_id: replay_cost(items[positions[0]].case) * len(positions)
        for case_id, positions in by_case.items()
    }
    loads = [0] * jobs
    shares: list[list[int]] = [[] for _ in range(jobs)]
    for case_id in sorted(by_case, key=lambda c: (-costs[c], by_case[c][0])):
        worker = min(range(jobs), key=lambda w: (loads[w], w))
        shares[worker].extend(by_case[case_id])
        loads[worker] += costs[case_id]
    return [[items[i] for i in sorted(share)] for share in shares if share]


def _cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def worker_dir(task: WorkerTask) -> Path:
    """Where a worker's proxy keeps its config, log and state."""
    return task.options.out / f"worker-{task.number}"


def worker_main(task: WorkerTask, reports: Queue[Report]) -> None:
    """A worker process: replay its share, report progress, then done or failed."""
    started = time.perf_counter()
    try:
        replayed = asyncio.run(_replay_share(task, reports))
    except BaseException as error:
        written = worker_dir(task).joinpath("error.txt")
        written.parent.mkdir(parents=True, exist_ok=True)
        written.write_text(traceback.format_exc())
        what = "".join(traceback.format_exception_only(error)).strip()
        reports.put(("failed", task.number, f"{what}\n  (traceback in {written})"))
        raise SystemExit(1) from None
    done = {
        "worker": task.number,
        "pairs": len(task.items),
        "steps": sum(len(item.case.steps) for item in task.items),
        "seconds": round(time.perf_counter() - started, 3),
        # CPU of the worker's own Python, and of its proxy (stopped and waited for by now).
        "harness_cpu_seconds": round(_cpu_seconds(resource.RUSAGE_SELF), 3),
        "proxy_cpu_seconds": round(_cpu_seconds(resource.RUSAGE_CHILDREN), 3),
        "unexpected_upstream_requests": replayed.unexpected_upstream_requests,
    }
    reports.put(("done", task.number, done))


async def _replay_share(task: WorkerTask, reports: Queue[Report]) -> Replayed:
    # Stopped by the run (SIGTERM), or the run is gone: cancel, so that the proxy and the
    # upstream are stopped.
    current = asyncio.current_task()
    assert current is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, current.cancel)
    watch = asyncio.create_task(_cancel_when_orphaned(current, os.getppid()))
    steps = StepCounter(lambda count: reports.put(("steps", task.number, count)))
    try:
        return await replay_items(task.options, task.loaded, task.items, worker_dir(task), steps.step)
    finally:
        steps.flush()
        watch.cancel()


class StepCounter:
    """Steps reported to the run a few times a second, not one message per step."""

    def __init__(self, report: Callable[[int], None], interval: float = 0.25) -> None:
        self.report = report
        self.interval = interval
        self.pending = 0
        self.last = time.monotonic()

    def step(self) -> None:
        self.pending += 1
        if time.monotonic() - self.last >= self.interval:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.report(self.pending)
            self.pending = 0
        self.last = time.monotonic()


async def _cancel_when_orphaned(task: asyncio.Task[Replayed], parent: int) -> None:
    while True:
        await asyncio.sleep(1.0)
        if os.getppid() != parent:
            task.cancel()
            return


async def replay_in_workers(
    options: RunOptions,
    loaded: Loaded,
    items: Sequence[WorkItem],
    on_steps: Callable[[int], None] = lambda steps: None,
) -> WorkersDone:
    """Replay ``items`` in ``options.jobs`` worker processes (their parts are saved in the run
    directory); returns what each worker did. Raises ``WorkerFailed`` when a worker fails (the
    others are stopped; the parts already saved are kept for the next run)."""
    context = multiprocessing.get_context("spawn")
    reports: Queue[Report] = context.Queue()
    workers: dict[int, BaseProcess] = {}
    done: dict[int, dict[str, Any]] = {}
    failures: dict[int, str] = {}

    def take_reports() -> None:
        while True:
            try:
                kind, number, value = reports.get_nowait()
            except queue.Empty:
                return
            if kind == "steps":
                on_steps(int(value))
            elif kind == "done":
                done[number] = dict(value)
            else:
                failures[number] = str(value)

    try:
        for number, share in enumerate(split_items(items, options.jobs), start=1):
            case_ids = {item.case.case_id for item in share}
            task = WorkerTask(number, options, only_cases(loaded, case_ids), tuple(share))
            process = context.Process(
                target=worker_main, args=(task, reports), name=f"replay-worker-{number}"
            )
            workers[number] = process
            process.start()
        while len(done) < len(workers) and not failures:
            take_reports()
            exited = [n for n, p in workers.items() if p.exitcode is not None and n not in done]
            if exited:
                take_reports()  # a report sent just before the exit
                for number in exited:
                    if number not in done and number not in failures:
                        failures[number] = f"exited with code {workers[number].exitcode}"
            await asyncio.sleep(0.05)
    finally:
        failed_first = dict(failures)  # the others fail below only because they are stopped
        started = [p for p in workers.values() if p.pid is not None]
        _stop([p for n, p in workers.items() if n not in done and p.pid is not None], started, take_reports)
        reports.close()
    if failed_first:
        detail = "\n".join(f"worker {n}: {text}" for n, text in sorted(failed_first.items()))
        stopped = len(workers) - len(done) - len(failed_first)
        raise WorkerFailed(
            f"{len(failed_first)} of {len(workers)} replay workers failed"
            + (f" ({stopped} more stopped)" if stopped else "")
            + f":\n{detail}"
        )
    return WorkersDone(
        sum(int(d["unexpected_upstream_requests"]) for d in done.values()),
        [done[number] for number in sorted(done)],
    )


def _stop(
    unfinished: Sequence[BaseProcess], workers: Sequence[BaseProcess], drain: Callable[[], None]
) -> None:
    """Stop the unfinished workers (SIGTERM: they stop their proxies) and wait for every worker,
    reading their reports meanwhile (a worker exits only once its reports are read)."""
    for process in unfinished:
        if process.exitcode is None:
            process.terminate()
    deadline = time.monotonic() + STOP_SECONDS
    while any(p.exitcode is None for p in workers) and time.monotonic() < deadline:
        drain()
        for process in workers:
            process.join(0.02)
    for process in workers:
        if process.exitcode is None:
            process.kill()
            process.join(5)
    drain()
