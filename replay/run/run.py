"""Shadow replay: recorded cases through the running proxy, arm by arm (``replay run``).

Every (arm, case) pair is replayed by a replayer (``replay.run.replayer``): a recorded upstream and
a proxy, the case's steps as requests in one session, then its questions. ``--jobs N`` splits
the pairs over N worker processes, each with its own upstream and proxy (``replay.run.jobs``);
``--shard K/N`` replays only a slice of the cases, for ``replay merge`` to combine
(``replay.run.shards``). Each finished pair is saved under ``DIR/parts`` with a key (``replay.run.parts``)
so an interrupted run resumes, and ``DIR/manifest.json`` names what the run directory holds.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from proxy.config.settings import Settings
from replay.run.jobs import WorkerFailed, replay_in_workers
from replay.run.loading import Loaded, load_cases
from replay.run.parts import PART_VERSION, CasePart, WorkItem, part_key, part_path, read_part
from replay.run.progress import Progress
from replay.run.replayer import REPLAY_KEY, Replayer, RunOptions, proxy_settings, replay_items
from replay.run.shards import Shard, run_manifest, write_manifest

__all__ = [
    "PART_VERSION",
    "REPLAY_KEY",
    "CasePart",
    "Loaded",
    "Replayer",
    "RunOptions",
    "WorkerFailed",
    "load_cases",
    "policy_specs_of",
    "run_replay",
    "saved_parts",
    "work_items",
]


def check_options(options: RunOptions, settings: Settings) -> None:
    """Raise ``ValueError`` naming what is wrong with the options, before anything starts."""
    unknown = [arm for arm in options.config.arms if arm not in settings.policies]
    if unknown:
        raise ValueError(
            f"arms not defined in the proxy configuration: {', '.join(unknown)} "
            f"(defined: {', '.join(settings.policies)})"
        )
    if options.proxy_url is not None and not options.upstream_port:
        raise ValueError(
            "--proxy-url needs --upstream-port: the given proxy must forward to the recorded "
            "upstream at http://127.0.0.1:<upstream-port>/v1"
        )
    if options.config.summarizer_model is not None:
        options.config.summarizer_model.api_key()  # its environment variable must be set
    if options.jobs < 1:
        raise ValueError("--jobs must be at least 1")
    if options.jobs > 1 and (options.proxy_url is not None or options.upstream_port):
        raise ValueError(
            "--jobs starts a recorded upstream and a proxy per worker: "
            "not with --proxy-url or --upstream-port"
        )


def policy_specs_of(settings: Settings) -> dict[str, Any]:
    return {name: msgspec.to_builtins(policy) for name, policy in settings.policies.items()}


def work_items(loaded: Loaded, options: RunOptions, policy_specs: dict[str, Any]) -> list[WorkItem]:
    """Every (arm, case) of the run, arm-major (one arm's cases together in the proxy's caches)."""
    config = options.config
    return [
        WorkItem(arm, case, part_key(arm, case, config, policy_specs[arm], loaded.input_sha256))
        for arm in config.arms
        for case in loaded.cases
    ]


def saved_parts(run_dir: Path, items: Sequence[WorkItem]) -> dict[tuple[str, str], CasePart]:
    """The parts of ``items`` saved in ``run_dir`` under their keys."""
    parts: dict[tuple[str, str], CasePart] = {}
    for item in items:
        part = read_part(part_path(run_dir, item.arm, item.case.case_id), item.key)
        if part is not None:
            parts[(item.arm, item.case.case_id)] = part
    return parts


def _cancel_on_sigterm() -> Callable[[], None]:
    """SIGTERM cancels the running replay, so that the proxies and workers it started are
    stopped; returns the undo (nothing happens outside the main thread)."""
    loop = asyncio.get_running_loop()
    current = asyncio.current_task()
    if current is None:
        return lambda: None
    try:
        loop.add_signal_handler(signal.SIGTERM, current.cancel)
    except (ValueError, RuntimeError, NotImplementedError):
        return lambda: None

    def undo() -> None:
        loop.remove_signal_handler(signal.SIGTERM)

    return undo


async def run_replay(options: RunOptions) -> dict[str, Any]:
    """Replay every case (of the shard) through every arm; returns the raw parts and what the
    results need (see ``replay.report.results``)."""
    config = options.config
    settings = proxy_settings(options)
    check_options(options, settings)
    shard = options.shard or Shard.whole()
    loaded = load_cases(
        options.input, options.limit, config.kinds, keep=shard.holds if not shard.complete else None
    )
    specs = policy_specs_of(settings)
    manifest = run_manifest(
        input_path=options.input,
        limit=options.limit,
        shard=shard,
        config=config,
        settings=settings,
        policy_specs=specs,
        proxy=options.proxy_url or "own",
        loaded=loaded,
    )
    write_manifest(options.out, manifest)
    items = work_items(loaded, options, specs)
    parts = saved_parts(options.out, items)
    pending = [item for item in items if (item.arm, item.case.case_id) not in parts]
    progress = Progress(sum(len(item.case.steps) for item in items), enabled=options.progress)
    progress.advance(sum(len(item.case.steps) for item in items if (item.arm, item.case.case_id) in parts))
    started = time.perf_counter()
    unexpected = 0
    workers: list[dict[str, Any]] = []
    stop_on_sigterm = _cancel_on_sigterm()
    try:
        if options.jobs > 1 and len(pending) > 1:
            by_workers = await replay_in_workers(options, loaded, pending, progress.advance)
            unexpected, workers = by_workers.unexpected_upstream_requests, by_workers.workers
            replayed = saved_parts(options.out, pending)
            if len(replayed) != len(pending):
                raise WorkerFailed(f"the workers saved {len(replayed)} of {len(pending)} parts")
            parts.update(replayed)
        elif pending:
            done = await replay_items(options, loaded, pending, options.out, progress.advance)
            parts.update(done.parts)
            unexpected = done.unexpected_upstream_requests
    finally:
        progress.close()
        stop_on_sigterm()
    seconds = time.perf_counter() - started
    finished = {"finished": True, "seconds": round(seconds, 3), "unexpected_upstream_requests": unexpected}
    write_manifest(options.out, {**manifest, **finished, "workers": workers})
    return {
        "loaded": loaded,
        "parts": parts,
        "seconds": seconds,
        "policy_specs": specs,
        "proxy_url": options.proxy_url or "own",
        "unexpected_upstream_requests": unexpected,
    }
