"""What the proxy adds per door: Chat Completions, the Responses API and Anthropic Messages,
side by side in one run, for the same conversation written in each format.

For each size, the same agent history (``bodies.py``) is written as a request of each door
(``replay/session/doors.py``) and sent sequentially over one keep-alive connection, directly to the
fake upstream and through the proxy, interleaved and alternating in order from one repetition
to the next. Reported per door and size: the median latency the proxy adds, the proxy's CPU
per request (its process tree's ticks over the requests), and both as ratios to chat.

    .venv/bin/python benchmarks/dialects.py --reps 5 --md-out /tmp/dialects.md

Everything runs on 127.0.0.1; every loop is bounded; every process started here is stopped
by its PID at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import bodies
from probes import Endpoint, HttpConnection
from processes import CLK_TCK, ROOT, Processes, free_port, settle, tree_ticks

sys.path.insert(0, str(ROOT))
from replay.session.doors import PATHS, request

DOORS = ("chat", "responses", "anthropic")
MODELS = {"chat": "gpt-4o", "responses": "gpt-4o", "anthropic": "claude-sonnet-4-6"}
HEADERS = {
    "chat": {"Authorization": "Bearer sk-bench"},
    "responses": {"Authorization": "Bearer sk-bench"},
    "anthropic": {"x-api-key": "sk-ant-bench", "anthropic-version": "2023-06-01"},
}


def door_bodies(size_tokens: dict[str, int]) -> dict[tuple[str, str], bytes]:
    sized = bodies.sized_bodies(size_tokens)
    result = {}
    for label, (_, body) in sized.items():
        for door in DOORS:
            wire = request(door, MODELS[door], body["messages"], body.get("tools") or [])
            result[(label, door)] = json.dumps(wire, separators=(",", ":")).encode()
    return result


def timed(connection: HttpConnection, body: bytes, count: int) -> list[float]:
    times = []
    for _ in range(count):
        timing = connection.post(body)
        if timing.status != 200:
            raise RuntimeError(f"{connection.endpoint.name}: HTTP {timing.status}: {timing.body[:300]!r}")
        times.append(timing.total)
    return times


def measure(args: argparse.Namespace, upstream_port: int, proxy_port: int, proxy_pid: int) -> dict[str, Any]:
    payloads = door_bodies({label: bodies.parse_size(label) for label in args.sizes.split(",")})
    results: dict[str, Any] = {}
    extra = {"X-Compaction-Policy": args.policy} if args.policy else {}
    for (label, door), body in payloads.items():
        direct = Endpoint("direct", "127.0.0.1", upstream_port, PATHS[door], HEADERS[door])
        proxied = Endpoint("proxy", "127.0.0.1", proxy_port, PATHS[door], {**HEADERS[door], **extra})
        direct_times: list[float] = []
        proxy_times: list[float] = []
        ticks = requests = 0
        with HttpConnection(direct) as to_direct, HttpConnection(proxied) as to_proxy:
            timed(to_direct, body, args.warmup)
            timed(to_proxy, body, args.warmup)
            for rep in range(args.reps):
                order = [(to_direct, direct_times), (to_proxy, proxy_times)]
                for connection, times in order if rep % 2 == 0 else order[::-1]:
                    settle(proxy_pid)
                    before = tree_ticks(proxy_pid)
                    times += timed(connection, body, args.requests)
                    if connection is to_proxy:
                        ticks += tree_ticks(proxy_pid) - before
                        requests += args.requests
        added = statistics.median(proxy_times) - statistics.median(direct_times)
        results.setdefault(label, {})[door] = {
            "bytes": len(body),
            "direct_ms": statistics.median(direct_times) * 1000,
            "added_ms": added * 1000,
            "cpu_ms": ticks / CLK_TCK / requests * 1000,
        }
        print(f"{label} {door}: +{added * 1000:.3f} ms", file=sys.stderr, flush=True)
    return results


def markdown(results: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [
        f"Policy: {args.policy or 'the proxy default (full)'}; {args.reps} x {args.requests} sequential "
        "requests per door and size, one keep-alive connection, interleaved with direct calls.",
        "",
        "| size | door | body bytes | direct p50 ms | added p50 ms | proxy CPU ms/req "
        "| added / chat | CPU / chat |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, doors in results.items():
        chat = doors["chat"]
        for door, row in doors.items():
            added, cpu = row["added_ms"] / chat["added_ms"], row["cpu_ms"] / chat["cpu_ms"]
            lines.append(
                f"| {label} | {door} | {row['bytes']:,} | {row['direct_ms']:.3f} | {row['added_ms']:.3f} | "
                f"{row['cpu_ms']:.3f} | {added:.2f} | {cpu:.2f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="2k,30k,120k")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--requests", type=int, default=40, help="sequential requests per repetition")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--policy", help="sent as X-Compaction-Policy (default: the proxy's, full)")
    parser.add_argument("--md-out", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cpx-dialects-") as tmp:
        procs = Processes(Path(tmp))
        try:
            upstream_port = free_port()
            procs.start_upstream(upstream_port, chunks=8, chunk_interval_ms=0.0, delay_ms=0.0)
            anthropic = {"anthropic": {"base_url": f"http://127.0.0.1:{upstream_port}"}}
            proxy_port, proxy_pid = procs.start_proxy(upstream_port, anthropic)
            results = measure(args, upstream_port, proxy_port, proxy_pid)
        finally:
            procs.stop_all()
    text = markdown(results, args)
    sys.stdout.write(text)
    if args.md_out:
        args.md_out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
