"""Load: many concurrent streaming agent sessions through the proxy with policy `improved`.

Each session starts from a task and grows step by step as an agent's does (an assistant tool
call and a ~1k-token tool output per request), streaming every answer; the model window is
set small so sessions compact during the run. The same load first runs against the fake
upstream directly for the latency baseline. Reports errors, p50/p99 latency (to the end of the
stream) direct and through the proxy, and the proxy's CPU and RSS every few seconds (with
``--workers`` > 1: the total of the supervisor and its workers, and each worker's).

    .venv/bin/python benchmarks/load.py --sessions 200 --seconds 60
    .venv/bin/python benchmarks/load.py --sessions 200 --seconds 60 --workers 2
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from processes import CLK_TCK, Processes, free_port, tree_ticks

WORDS = [
    "def",
    "return",
    "import",
    "assert",
    "pytest",
    "error",
    "value",
    "result",
    "module",
    "parse",
    "token",
    "line",
    "file",
]


def output_text(rng: random.Random, lines: int = 60) -> str:
    return "\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(lines))


async def session(
    http: aiohttp.ClientSession,
    url: str,
    index: int,
    deadline: float,
    latencies: list[float],
    errors: list[str],
    headers: dict[str, str],
) -> None:
    rng = random.Random(index)
    messages: list[Any] = [
        {"role": "system", "content": "You are a coding agent. " * 50},
        {"role": "user", "content": f"Task {index}: fix the failing test."},
    ]
    step = 0
    while time.monotonic() < deadline:
        body = orjson.dumps({"model": "gpt-4o", "messages": messages, "stream": True})
        started = time.perf_counter()
        try:
            async with http.post(
                url, data=body, headers={**headers, "x-session-id": f"load-{index}"}
            ) as response:
                if response.status != 200:
                    errors.append(f"HTTP {response.status}")
                async for _ in response.content.iter_any():
                    pass
            latencies.append(time.perf_counter() - started)
        except (TimeoutError, aiohttp.ClientError) as exc:
            errors.append(type(exc).__name__)
        call_id = f"c{index}_{step}"
        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": "execute_bash",
                            "arguments": orjson.dumps({"command": f"run {step}"}).decode(),
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": output_text(rng)},
        ]
        step += 1


async def drive(
    url: str, sessions: int, seconds: float, headers: dict[str, str]
) -> tuple[list[float], list[str]]:
    latencies: list[float] = []
    errors: list[str] = []
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=sessions)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        await asyncio.gather(
            *(session(http, url, i, deadline, latencies, errors, headers) for i in range(sessions))
        )
    return latencies, errors


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (uvicorn's workers when it supervises several)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                raw = (entry / "stat").read_bytes()
            except OSError:
                continue
            if int(raw[raw.rfind(b")") + 2 :].split()[1]) == pid:
                found.append(int(entry.name))
    return sorted(found)


Row = tuple[float, float, float, list[float]]


async def sample(pid: int, every: float, workers: int, stop: asyncio.Event, rows: list[Row]) -> None:
    start, ticks = time.monotonic(), tree_ticks(pid)
    while not stop.is_set():
        await asyncio.sleep(every)
        now_ticks = tree_ticks(pid)
        per_worker = [rss_mb(child) for child in children(pid)] if workers > 1 else []
        cpu = (now_ticks - ticks) / CLK_TCK / every * 100
        rows.append((time.monotonic() - start, cpu, rss_mb(pid) + sum(per_worker), per_worker))
        ticks = now_ticks


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else float("nan")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--direct-seconds", type=float, default=20.0)
    parser.add_argument("--window", type=int, default=16_000, help="model window the proxy assumes")
    parser.add_argument("--sample-every", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=1, help="proxy worker processes (server.workers)")
    parser.add_argument("--config", default="{}", help="extra proxy settings as JSON")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="the fake model's wait per answer")
    parser.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="also run the proxy from another checkout DIR (e.g. a git worktree of main), "
        "alternating with this one, and report both side by side",
    )
    parser.add_argument("--reps", type=int, default=1, help="runs per proxy, alternating")
    return parser.parse_args()


Run = tuple[list[float], list[str], list[Row], float]


def through_proxy(url: str, pid: int, args: argparse.Namespace) -> Run:
    """The load through one proxy; the last item is its CPU seconds over the run."""

    async def run() -> Run:
        stop, rows = asyncio.Event(), []
        ticks = tree_ticks(pid)
        sampler = asyncio.create_task(sample(pid, args.sample_every, args.workers, stop, rows))
        lat, err = await drive(url, args.sessions, args.seconds, {"authorization": "Bearer sk-load"})
        stop.set()
        await sampler
        return lat, err, rows, (tree_ticks(pid) - ticks) / CLK_TCK

    return asyncio.run(run())


def main() -> int:
    args = parse_args()
    roots = {"this": Path(__file__).resolve().parent.parent}
    for item in args.compare:
        name, _, directory = item.partition("=")
        roots[name] = Path(directory).resolve()
    runs: dict[str, list[Run]] = {name: [] for name in roots}
    with tempfile.TemporaryDirectory(prefix="cpx-load-") as tmp:
        procs = Processes(Path(tmp))
        try:
            up_port = free_port()
            procs.start_upstream(up_port, chunks=8, chunk_interval_ms=0.0, delay_ms=args.delay_ms)
            extra = {
                "policy": "improved",
                "context_windows": {"default": args.window},
                "server": {"workers": args.workers},
                **orjson.loads(args.config),
            }
            direct = f"http://127.0.0.1:{up_port}/v1/chat/completions"
            d_lat, d_err = asyncio.run(drive(direct, args.sessions, args.direct_seconds, {}))
            for rep in range(args.reps):
                order = list(roots) if rep % 2 == 0 else list(reversed(roots))
                for name in order:
                    # A fresh proxy per run: every run starts with cold sessions and caches.
                    port, pid = procs.start_proxy(up_port, extra, root=roots[name], name=f"{name}-{rep}")
                    url = f"http://127.0.0.1:{port}/v1/chat/completions"
                    runs[name].append(through_proxy(url, pid, args))
                    procs.stop(pid)
        finally:
            procs.stop_all()
    report(args, d_lat, d_err, runs)
    return 0


def report(
    args: argparse.Namespace, d_lat: list[float], d_err: list[str], runs: dict[str, list[Run]]
) -> None:
    print(
        f"{args.sessions} concurrent streaming sessions, "
        f"policy {orjson.loads(args.config).get('policy', 'improved')}, window {args.window:,}, "
        f"{args.workers} worker(s), model wait {args.delay_ms:g} ms\n"
    )
    print("| target | seconds | requests | errors | p50 ms | p99 ms | proxy CPU ms/request |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    print(
        f"| direct | {args.direct_seconds:g} | {len(d_lat)} | {len(d_err)} | "
        f"{pct(d_lat, 0.5):.1f} | {pct(d_lat, 0.99):.1f} | - |"
    )
    for name, name_runs in runs.items():
        for rep, (lat, err, _, cpu) in enumerate(name_runs):
            per_request = cpu * 1000 / max(1, len(lat))
            print(
                f"| proxy {name} (run {rep + 1}) | {args.seconds:g} | {len(lat)} | {len(err)} | "
                f"{pct(lat, 0.5):.1f} | {pct(lat, 0.99):.1f} | {per_request:.2f} |"
            )
    print_shares(runs)
    for name, name_runs in runs.items():
        print(
            f"\n{name}, last run:\n\n| t (s) | proxy CPU % | proxy RSS MB | per worker MB |"
            "\n|---:|---:|---:|---|"
        )
        for t, cpu_pct, rss, per_worker in name_runs[-1][2]:
            workers = " / ".join(f"{value:.0f}" for value in per_worker) or "-"
            print(f"| {t:.0f} | {cpu_pct:.0f} | {rss:.0f} | {workers} |")
        errors = sorted({e for run in name_runs for e in run[1]})
        if errors:
            print("\nerrors:", errors)


def cpu_per_request(run: Run) -> float:
    return run[3] * 1000 / max(1, len(run[0]))


def print_shares(runs: dict[str, list[Run]]) -> None:
    """With ``--compare``: each proxy's mean CPU a request, and this checkout's as a share of
    each other's, of the means and of each pair of runs made one after the other (the machine's
    speed drifts between runs, so a share compares what one run of each measured)."""
    if len(runs) < 2:
        return
    means = {name: sum(map(cpu_per_request, name_runs)) / len(name_runs) for name, name_runs in runs.items()}
    print("\n| proxy | mean CPU ms/request | this / it (means) | this / it (pairs of runs) |")
    print("|---|---:|---:|---|")
    for name, name_runs in runs.items():
        if name == "this":
            print(f"| this | {means[name]:.3f} | - | - |")
            continue
        pairs = [
            cpu_per_request(a) / cpu_per_request(b) for a, b in zip(runs["this"], name_runs, strict=True)
        ]
        shares = f"{min(pairs):.2f}-{max(pairs):.2f}"
        print(f"| {name} | {means[name]:.3f} | {means['this'] / means[name]:.3f} | {shares} |")


if __name__ == "__main__":
    raise SystemExit(main())
