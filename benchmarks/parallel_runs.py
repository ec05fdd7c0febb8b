"""Parallel runs of one task: under one key, they must behave as under one key each.

Eight recorded agent runs (native tool calls, from the sample trajectories) are given one
system prompt and one task, as pass@k, A/A' repeats or an agent fleet would send them, and
replayed request by request, concurrently and interleaved, through the real proxy (policy
``improved``, a forced window) into a small upstream that records what each run's requests
looked like. The same eight runs go through twice: all under one API key, then under eight
keys. Per arm: requests, compaction points, dropped checkpoints, sessions seen in the events,
prefix stability (the share of requests whose view starts with that run's previous view, the
condition for the upstream's prompt cache to hit) and mean view tokens.

    .venv/bin/python benchmarks/parallel_runs.py [--runs 8] [--window 12000] [--md-out FILE]

Traffic stays on 127.0.0.1; every process started is stopped by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import itertools
import json
import sys
import tempfile
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import orjson
from aiohttp import web

from replay.recording.cases import Case, build_cases
from replay.recording.rows import iter_rows
from replay.session.proxy_process import ProxyProcess, free_port

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "trajectories.jsonl"
FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "trajectories_sample.jsonl"
RUN_HEADER = "x-bench-run"


def digest(message: Any) -> bytes:
    return hashlib.blake2b(orjson.dumps(message, option=orjson.OPT_SORT_KEYS), digest_size=12).digest()


class Recorder:
    """The upstream: answers "ok", remembers each run's views as message digests."""

    def __init__(self) -> None:
        self.views: dict[str, list[tuple[bytes, ...]]] = defaultdict(list)
        self.port = free_port()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()

    async def handle(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        run = request.headers.get(RUN_HEADER, "?")
        self.views[run].append(tuple(digest(m) for m in body.get("messages", [])))
        answer = {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model"),
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        return web.json_response(answer)

    def start(self) -> None:
        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            app = web.Application(client_max_size=1 << 30)
            app.router.add_post("/v1/chat/completions", self.handle)
            runner = web.AppRunner(app, access_log=None, handle_signals=False)
            loop.run_until_complete(runner.setup())
            loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
            self._ready.set()
            loop.run_forever()

        threading.Thread(target=serve, daemon=True).start()
        self._ready.wait(10)

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)


def pick_runs(count: int) -> list[Case]:
    """``count`` recorded runs with native tool calls, given run 0's system prompt and task."""
    source = DATA if DATA.exists() else FIXTURE
    cases = [
        c
        for c in build_cases(iter_rows(source))
        if isinstance(c, Case) and any(m.get("tool_calls") for m in c.messages) and len(c.messages) > 20
    ]
    if len(cases) < count:
        raise SystemExit(f"only {len(cases)} runs with tool calls in {source}")
    chosen = cases[:count]
    head = chosen[0].messages[:2]
    return [dataclasses.replace(c, messages=(*head, *c.messages[2:])) for c in chosen]


async def replay(proxy: str, runs: list[Case], keys: list[str]) -> dict[str, Any]:
    """Every run request by request, all runs at once; the compaction headers counted."""
    triggers: dict[str, list[str]] = defaultdict(list)
    tokens: list[int] = []
    async with httpx.AsyncClient(base_url=proxy, timeout=120, trust_env=False) as client:

        async def one(index: int, case: Case) -> None:
            for position in case.steps:
                response = await client.post(
                    "/v1/chat/completions",
                    json={
                        "model": "bench-model",
                        "messages": list(case.messages[:position]),
                        "tools": list(case.tools),
                    },
                    headers={"authorization": f"Bearer {keys[index]}", RUN_HEADER: str(index)},
                )
                response.raise_for_status()
                tokens.append(int(response.headers["x-compaction-tokens-after"]))
                if response.headers.get("x-compaction-trigger"):
                    triggers[str(index)].append(response.headers["x-compaction-trigger"])
                await asyncio.sleep(0)

        await asyncio.gather(*(one(i, case) for i, case in enumerate(runs)))
    return {"triggers": triggers, "tokens": tokens}


def stability(views: dict[str, list[tuple[bytes, ...]]]) -> tuple[int, int]:
    """(requests whose view extends the run's previous view, requests after each run's first)."""
    stable = total = 0
    for run_views in views.values():
        for previous, current in itertools.pairwise(run_views):
            total += 1
            stable += current[: len(previous)] == previous
    return stable, total


def events(proxy: ProxyProcess, keys: list[str]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for key in dict.fromkeys(keys):
        response = httpx.get(
            proxy.url + "/v1/compaction/events",
            params={"limit": 1000},
            headers={"authorization": f"Bearer {key}"},
            trust_env=False,
        )
        found += response.json()["data"]
    return found


def arm(runs: list[Case], keys: list[str], window: int, workdir: Path) -> dict[str, Any]:
    recorder = Recorder()
    recorder.start()
    config = {
        "upstream": {"base_url": f"http://127.0.0.1:{recorder.port}/v1"},
        "policy": "improved",
        "context_windows": {"default": window},
        "state_dir": str(workdir / "state"),
        "logging": {"level": "warning", "format": "json"},
    }
    proxy = ProxyProcess(config, workdir)
    proxy.start()
    try:
        replayed = asyncio.run(replay(proxy.url, runs, keys))
        found = events(proxy, keys)
    finally:
        proxy.stop()
        recorder.stop()
    stable, total = stability(recorder.views)
    return {
        "requests": sum(len(v) for v in recorder.views.values()),
        "compaction_points": sum(len(t) for t in replayed["triggers"].values()),
        "dropped_checkpoints": sum(1 for e in found if e.get("checkpoint_dropped")),
        "sessions": len({e["session"] for e in found}),
        "forks": sum(1 for e in found if e.get("session_fork")),
        "prefix_stable": stable,
        "prefix_total": total,
        "mean_view_tokens": round(sum(replayed["tokens"]) / max(1, len(replayed["tokens"]))),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--window", type=int, default=12_000)
    parser.add_argument("--md-out", type=Path)
    args = parser.parse_args(argv)
    runs = pick_runs(args.runs)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        one_key = ["sk-bench-shared-000000000000"] * args.runs
        many_keys = [f"sk-bench-run{i}-0000000000000" for i in range(args.runs)]
        results["one key"] = arm(runs, one_key, args.window, Path(tmp) / "one")
        results[f"{args.runs} keys"] = arm(runs, many_keys, args.window, Path(tmp) / "many")
    lines = [
        f"{args.runs} parallel runs of one task, policy improved, window {args.window}",
        "",
        "| arm | requests | compaction points | dropped checkpoints | sessions | forks | prefix stable "
        "| mean view tokens |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in results.items():
        share = row["prefix_stable"] / max(1, row["prefix_total"])
        stable = f"{share:.1%} ({row['prefix_stable']}/{row['prefix_total']})"
        lines.append(
            f"| {name} | {row['requests']} | {row['compaction_points']} | {row['dropped_checkpoints']} | "
            f"{row['sessions']} | {row['forks']} | {stable} | {row['mean_view_tokens']} |"
        )
    report = "\n".join(lines)
    print(report)
    print(json.dumps(results), file=sys.stderr)
    if args.md_out:
        args.md_out.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
