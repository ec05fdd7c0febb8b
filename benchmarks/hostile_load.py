"""Small requests stay fast while hostile ones are processed.

Three clients keep a 58 MB chat body each in flight (one of 100,000 small messages, one with a
10 MB line, one of 6,000 long messages), a fourth keeps making the model run a catastrophic
pattern over a large saved output through ``read_tool_output``, and meanwhile one client
measures ``/healthz`` and a small chat request, one after the other. Reports p50/p99/max of the
small requests, how many hostile requests completed, and the proxy's RSS (its own process and
its worker processes) over the run. Policy ``improved``; traffic on 127.0.0.1 only.

    .venv/bin/python benchmarks/hostile_load.py [--seconds 60] [--md-out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import orjson
from aiohttp import web

from replay.session.proxy_process import ProxyProcess, free_port

HANDLE = re.compile(rb"handle=(out_[0-9a-f]+)")
KEY = "sk-bench-hostile-000000000000"


def answer(content: str | None, calls: list[Any] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


class Upstream:
    """Answers "ok"; a request of the hostile session that names a handle gets a read call
    with a backtracking pattern (until the proxy's round limit)."""

    def __init__(self) -> None:
        self.port = free_port()
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if b"HOSTILE-SESSION" in body[:4096] or b"HOSTILE-SESSION" in body[-200_000:]:
            handles = HANDLE.findall(body)
            if handles and b"read_tool_output" in body[-20_000:]:
                arguments = json.dumps({"handle": handles[0].decode(), "pattern": "(a+)+$"})
                call = {
                    "id": "r",
                    "type": "function",
                    "function": {"name": "read_tool_output", "arguments": arguments},
                }
                return web.json_response(answer(None, [call]))
        return web.json_response(answer("ok"))

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


def step(i: int, output: str) -> list[dict[str, Any]]:
    call = {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{i}", "content": output},
    ]


def hostile_bodies() -> list[bytes]:
    """Three bodies of about 58 MB each, shaped to cost the most work per byte."""
    head = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix it."}]
    many = [*head]
    for i in range(50_000):  # 100,000 small messages
        many += step(i, f"line {i} " * 90)
    one_line = [*head, *step(0, "x" * 10_000_000), *step(1, "y " * 24_000_000)]
    medium = [*head]
    for i in range(3_000):  # 6,000 long messages
        medium += step(i, f"lorem ipsum {i} " * 1_150)
    return [orjson.dumps({"model": "gpt-4o", "messages": m}) for m in (many, one_line, medium)]


def hostile_read_history() -> list[dict[str, Any]]:
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "HOSTILE-SESSION: fix it."},
    ]
    messages += step(0, "\n".join("a" * 30 + "!" for _ in range(20_000)))
    for i in range(1, 40):
        messages += step(i, f"filler {i} " * 900)
    return messages


def rss_mb(pid: int) -> tuple[float, float]:
    """Resident memory of a process, and of its descendants, in MB."""
    own = others = 0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            kb = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
            if current == pid:
                own = kb
            else:
                others += kb
            for task in Path(f"/proc/{current}/task").iterdir():
                children = (task / "children").read_text().split()
                pending += [int(c) for c in children]
        except (OSError, AttributeError):
            continue
    return own / 1024, others / 1024


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


async def run(proxy: ProxyProcess, seconds: float) -> dict[str, Any]:
    bodies = hostile_bodies()
    hostile = orjson.dumps({"model": "gpt-4o", "messages": hostile_read_history()})
    small = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
    deadline = time.monotonic() + seconds
    done = {"large": 0, "hostile_read": 0, "errors": 0}
    latencies: dict[str, list[float]] = {"healthz": [], "small chat": []}
    peak = peak_own = peak_workers = 0.0
    limits = httpx.Limits(max_connections=16)
    async with httpx.AsyncClient(base_url=proxy.url, timeout=600, limits=limits, trust_env=False) as client:

        async def keep_sending(body: bytes, kind: str) -> None:
            while time.monotonic() < deadline:
                try:
                    response = await client.post("/v1/chat/completions", content=body, headers=headers)
                    done[kind if response.status_code == 200 else "errors"] += 1
                except httpx.HTTPError:
                    done["errors"] += 1

        async def measure() -> None:
            nonlocal peak, peak_own, peak_workers
            await asyncio.sleep(1.0)  # the large bodies are on their way
            while time.monotonic() < deadline:
                started = time.perf_counter()
                await client.get("/healthz")
                latencies["healthz"].append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                response = await client.post("/v1/chat/completions", content=small, headers=headers)
                latencies["small chat"].append((time.perf_counter() - started) * 1000)
                if response.status_code != 200:
                    done["errors"] += 1
                assert proxy.process is not None
                own, workers = rss_mb(proxy.process.pid)
                peak, peak_own, peak_workers = (
                    max(peak, own + workers),
                    max(peak_own, own),
                    max(peak_workers, workers),
                )
                await asyncio.sleep(0.05)

        await asyncio.gather(
            *(keep_sending(body, "large") for body in bodies),
            keep_sending(hostile, "hostile_read"),
            measure(),
        )
    return {
        "done": done,
        "latencies": latencies,
        "peak_rss_mb": peak,
        "peak_proxy_mb": peak_own,
        "peak_workers_mb": peak_workers,
        "bodies_mb": [len(b) / 1e6 for b in bodies],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--md-out", type=Path)
    args = parser.parse_args(argv)
    upstream = Upstream()
    upstream.start()
    with tempfile.TemporaryDirectory() as tmp:
        config = {
            "upstream": {"base_url": f"http://127.0.0.1:{upstream.port}/v1"},
            "policy": "improved",
            "context_windows": {"default": 128_000},
            "state_dir": str(Path(tmp) / "state"),
            "logging": {"level": "warning", "format": "json"},
        }
        proxy = ProxyProcess(config, Path(tmp))
        proxy.start()
        try:
            results = asyncio.run(run(proxy, args.seconds))
        finally:
            proxy.stop()
            upstream.stop()
    lines = [
        f"Hostile load for {args.seconds:.0f} s: three bodies of "
        + ", ".join(f"{mb:.0f}" for mb in results["bodies_mb"])
        + " MB kept in flight, and a backtracking pattern read in a loop",
        "",
        "| request | count | p50 ms | p99 ms | max ms |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, values in results["latencies"].items():
        lines.append(
            f"| {name} | {len(values)} | {statistics.median(values):.1f} | {percentile(values, 0.99):.1f} "
            f"| {max(values):.1f} |"
        )
    done = results["done"]
    lines += [
        "",
        f"Large bodies answered: {done['large']}, hostile reads answered: {done['hostile_read']}, "
        f"errors: {done['errors']}; peak RSS (proxy and its workers): {results['peak_rss_mb']:.0f} MB "
        f"(proxy process {results['peak_proxy_mb']:.0f} MB, workers {results['peak_workers_mb']:.0f} MB)",
    ]
    report = "\n".join(lines)
    print(report)
    if args.md_out:
        args.md_out.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
