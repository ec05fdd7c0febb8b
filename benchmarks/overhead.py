"""Pass-through overhead of compaction-proxy, side by side with direct calls, in one run.

Starts the fake upstream (``fake_upstream.py``) and the proxy in front of it, then for each
cell (body size x streaming x concurrency) runs wrk against the upstream directly and
through the proxy, interleaved and alternating in order from one repetition to the next, so
that the noise of a shared 2-core machine hits both alike. Then: time to the first streamed
``data:``, and a growing agent session sent request by request, cold and again warm.

    .venv/bin/python benchmarks/overhead.py --reps 3 --md-out /tmp/overhead.md

Everything runs on 127.0.0.1; every loop is bounded in count and time; every process this
script starts is stopped by its PID at the end, Ctrl-C included. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import bodies
import report
from probes import Endpoint, HttpConnection, SessionSample, chat_endpoint, session_run, ttfb_probe
from processes import CLK_TCK, HERE, ROOT, Processes, answers, free_port, http_call, settle, tree_ticks

Record = dict[str, Any]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Target:
    """A benchmarked endpoint and the PID whose process tree its CPU is read from."""

    endpoint: Endpoint
    pid: int | None

    @property
    def name(self) -> str:
        return self.endpoint.name


def run_wrk(target: Target, body_file: Path, conc: int, seconds: float, args: argparse.Namespace) -> Record:
    """One closed-loop wrk run. wrk only takes whole seconds, so it gets a longer ``-d`` and
    a SIGINT after ``seconds``: it then stops and reports the time it really ran."""
    threads = min(2, conc)
    env = {
        **os.environ,
        "WRK_BODY_FILE": str(body_file),
        "WRK_HEADERS": "\n".join(f"{k}: {v}" for k, v in target.endpoint.headers.items()),
        "WRK_MAX_PER_THREAD": str(math.ceil(args.max_requests / threads)),
    }
    argv = ["wrk", f"-t{threads}", f"-c{conc}", f"-d{math.ceil(seconds) + 2}s", f"--timeout={args.timeout}s"]
    argv += ["-s", str(HERE / "wrk_post.lua"), target.endpoint.url]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    try:
        try:
            out, err = proc.communicate(timeout=seconds)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=args.timeout + 10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for line in out.splitlines():
        if line.startswith("WRK_JSON "):
            result: Record = json.loads(line.removeprefix("WRK_JSON "))
            return result
    raise RuntimeError(f"wrk failed ({proc.returncode}): {out[-500:]} {err[-500:]}")


def upstream_stats(port: int) -> Record:
    stats: Record = json.loads(http_call(port, "GET", "/stats")[1])
    return stats


def measure(target: Target, body_file: Path, conc: int, args: argparse.Namespace, upstream: Target) -> Record:
    """One measured run: wrk's figures plus CPU per request and what reached the upstream."""
    stats0, ticks0 = (
        upstream_stats(upstream.endpoint.port),
        {t.pid: tree_ticks(t.pid) for t in (target, upstream) if t.pid},
    )
    wrk = run_wrk(target, body_file, conc, args.duration, args)
    ticks1 = {pid: tree_ticks(pid) for pid in ticks0}
    stats1 = upstream_stats(upstream.endpoint.port)
    settle(target.pid)
    n = wrk["requests"]
    ok = n > 0

    def cpu_ms(pid: int | None) -> float | None:
        return (ticks1[pid] - ticks0[pid]) * 1000 / CLK_TCK / n if pid and ok else None

    forwarded = stats1["requests"] - stats0["requests"]
    errors = sum(
        wrk[k] for k in ("errors_connect", "errors_read", "errors_write", "errors_status", "errors_timeout")
    )
    return {
        "requests": n,
        "seconds": wrk["duration_us"] / 1e6,
        "rps": n / (wrk["duration_us"] / 1e6) if wrk["duration_us"] else 0.0,
        **{f"p{q}_ms": wrk[f"p{q}_us"] / 1000 if ok else None for q in (50, 90, 99)},
        "errors": errors,
        "capped": n >= args.max_requests,
        "cpu_ms_per_req": cpu_ms(target.pid),
        "upstream_cpu_ms_per_req": cpu_ms(upstream.pid),
        "upstream_requests_per_req": forwarded / n if ok else None,
        "fwd_kb_per_req": (stats1["body_bytes"] - stats0["body_bytes"]) / 1024 / forwarded
        if forwarded
        else None,
    }


def run_matrix(
    direct: Target, proxy: Target, files: dict[tuple[str, str], Path], args: argparse.Namespace
) -> list[Record]:
    cells = [(s, m, c) for s in args.sizes for m in args.modes for c in args.conc]
    raw: dict[tuple[str, str, int], dict[str, list[Record]]] = {
        cell: {"direct": [], "proxy": []} for cell in cells
    }
    total, done = len(cells) * args.reps * 2, 0
    seconds = total * (args.duration + args.warmup + 0.5)
    log(f"matrix: {len(cells)} cells x {args.reps} reps x 2 targets, about {seconds:.0f} s")
    for rep in range(args.reps):
        order = [direct, proxy] if rep % 2 == 0 else [proxy, direct]
        for size, mode, conc in cells:
            for target in order:
                if args.warmup > 0:
                    run_wrk(target, files[size, mode], conc, args.warmup, args)
                    settle(target.pid)
                rec = measure(target, files[size, mode], conc, args, direct)
                raw[size, mode, conc][target.name].append(rec)
                done += 1
                p50, p99, cpu = (report.fmt_ms(rec[k]) for k in ("p50_ms", "p99_ms", "cpu_ms_per_req"))
                log(
                    f"[{done}/{total}] rep {rep + 1} {target.name:6} {size:>5} {mode:9} c={conc:<3} "
                    f"{rec['rps']:9.1f} req/s  p50 {p50}  p99 {p99} ms  cpu/req {cpu} ms  err {rec['errors']}"
                )
    return [
        {
            "size": s,
            "mode": m,
            "conc": c,
            **report.summarize_cell(raw[s, m, c]["direct"], raw[s, m, c]["proxy"]),
            "raw": raw[s, m, c],
        }
        for s, m, c in cells
    ]


def preflight(direct: Target, proxy: Target, body: dict[str, Any]) -> None:
    """One plain and one streaming request per target, and proof that the proxy forwards to
    this run's upstream: otherwise the comparison would be meaningless."""
    before = upstream_stats(direct.endpoint.port)["requests"]
    for target in (direct, proxy):
        with HttpConnection(target.endpoint) as conn:
            for stream in (False, True):
                timing = conn.post(bodies.encode(body, stream))
                complete = b"data: [DONE]" in timing.body if stream else b'"chat.completion"' in timing.body
                if timing.status != 200 or not complete:
                    raise RuntimeError(f"{target.name}: HTTP {timing.status}, body {timing.body[:300]!r}")
    if upstream_stats(direct.endpoint.port)["requests"] - before < 4:
        raise RuntimeError(f"the proxy did not forward to this run's upstream ({direct.endpoint.url})")


def git_revision() -> str:
    def git(*argv: str) -> str:
        return subprocess.run(
            ["git", *argv], cwd=ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="2k,30k,120k", help="body sizes in prompt tokens")
    p.add_argument("--conc", default="1,32", help="wrk connections per cell")
    p.add_argument("--modes", default="nonstream,stream")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--duration", type=float, default=4.0, help="seconds per measured wrk run")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds of unmeasured load before each run")
    p.add_argument("--max-requests", type=int, default=1_000_000, help="cap on responses per wrk run")
    p.add_argument("--timeout", type=int, default=30, help="wrk per-request timeout, seconds")
    p.add_argument("--ttfb", type=int, default=20, help="sequential streaming requests per size (0: skip)")
    p.add_argument("--skip-matrix", action="store_true", help="no wrk runs")
    p.add_argument("--skip-session", action="store_true")
    p.add_argument("--session-max-tokens", type=int, default=120_000)
    p.add_argument("--session-skip", type=int, default=3, help="requests excluded from the steady state")
    p.add_argument("--proxy-url", help="benchmark this running proxy (it must forward to --upstream-port)")
    p.add_argument("--proxy-pid", type=int, help="PID of the --proxy-url proxy, for CPU per request")
    p.add_argument(
        "--upstream-port", type=int, help="fake upstream port (default: free; 18000 with --proxy-url)"
    )
    p.add_argument("--policy", help="sent to the proxy as X-Compaction-Policy (default: none)")
    p.add_argument(
        "--tracing",
        action="store_true",
        help="the proxy exports a trace of every request to a local OTLP/HTTP sink (otlp_sink.py)",
    )
    p.add_argument("--header", action="append", default=[], help="'Name: value' sent to the proxy only")
    p.add_argument("--chunks", type=int, default=8, help="fake upstream: content chunks per stream")
    p.add_argument("--chunk-interval-ms", type=float, default=0.0, help="fake upstream: pause between chunks")
    p.add_argument("--delay-ms", type=float, default=0.0, help="fake upstream: pause before responding")
    p.add_argument("--md-out", type=Path)
    p.add_argument("--json-out", type=Path)
    args = p.parse_args(argv)
    args.sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    args.conc = [int(c) for c in args.conc.split(",") if c.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if set(args.modes) - {"nonstream", "stream"}:
        p.error("--modes takes nonstream and/or stream")
    if args.duration < 0.2 or args.reps < 1:
        p.error("--duration must be at least 0.2 s and --reps at least 1")
    if args.proxy_pid and not args.proxy_url:
        p.error("--proxy-pid goes with --proxy-url")
    return args


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def proxy_headers(args: argparse.Namespace) -> dict[str, str]:
    headers = {}
    for header in args.header:
        name, _, value = header.partition(":")
        headers[name.strip()] = value.strip()
    if args.policy:
        headers["X-Compaction-Policy"] = args.policy
    return headers


def tracing_config(procs: Processes) -> dict[str, object]:
    """Tracing on, every request sampled, exported to a sink started for this run."""
    port = free_port()
    argv = [sys.executable, str(HERE / "otlp_sink.py"), "--port", str(port)]
    procs.start("otlp_sink", argv, lambda: answers(port, "/"))
    endpoint = f"http://127.0.0.1:{port}/v1/traces"
    return {"tracing": {"enabled": True, "endpoint": endpoint, "sample_ratio": 1.0}}


def run(args: argparse.Namespace, procs: Processes, sized: dict[str, tuple[int, dict[str, Any]]]) -> Record:
    """Start what is needed, then the wrk matrix, the TTFB probe and the session runs."""
    up_port = args.upstream_port or (18000 if args.proxy_url else free_port())
    up_pid = procs.start_upstream(up_port, args.chunks, args.chunk_interval_ms, args.delay_ms)
    direct = Target(chat_endpoint("direct", f"http://127.0.0.1:{up_port}/v1"), up_pid)
    if args.proxy_url:
        proxy = Target(chat_endpoint("proxy", args.proxy_url, proxy_headers(args)), args.proxy_pid)
    else:
        port, pid = procs.start_proxy(up_port, tracing_config(procs) if args.tracing else None)
        proxy = Target(chat_endpoint("proxy", f"http://127.0.0.1:{port}/v1", proxy_headers(args)), pid)
    preflight(direct, proxy, next(iter(sized.values()))[1])
    files: dict[tuple[str, str], Path] = {}
    for size, (_, body) in sized.items():
        for mode in args.modes:
            files[size, mode] = procs.tmp / f"body_{size}_{mode}.json"
            files[size, mode].write_bytes(bodies.encode(body, stream=mode == "stream"))
    cells = [] if args.skip_matrix else run_matrix(direct, proxy, files, args)
    ttfb: dict[str, Record] = {}
    for size, (_, body) in sized.items() if args.ttfb > 0 else ():
        ttfb[size] = ttfb_probe(direct.endpoint, proxy.endpoint, bodies.encode(body, stream=True), args.ttfb)
        log(f"ttfb {size}: added first data {report.fmt_ms(ttfb[size]['added_first_data_ms'], True)} ms")
    sessions: dict[str, Record] = {}
    if not args.skip_session:
        session = bodies.grow_session(bodies.SESSION_SEED, args.session_max_tokens)
        encoded = [(tokens, bodies.encode(body)) for tokens, body in session]
        for name in ("cold", "warm"):  # warm: the same session again through the same proxy

            def progress(sample: SessionSample, name: str = name) -> None:
                if sample.index % 10 == 0:
                    log(
                        f"session {name} #{sample.index}: {sample.tokens:,} tokens, {sample.added_ms:+.2f} ms"
                    )

            samples = session_run(direct.endpoint, proxy.endpoint, encoded, progress=progress)
            sessions[name] = report.session_summary(samples, args.session_skip)
    return {"cells": cells, "ttfb": ttfb, "sessions": sessions}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.skip_matrix and not shutil.which("wrk"):
        log("wrk not found: apt-get install -y wrk (or run with --skip-matrix)")
        return 2
    # Explicit handlers: a shell starts background jobs with SIGINT ignored, and SIGTERM
    # must stop our processes too.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    sized = bodies.sized_bodies({s: bodies.parse_size(s) for s in args.sizes})
    log("bodies: " + ", ".join(f"{s} = {tokens:,} tokens" for s, (tokens, _) in sized.items()))
    procs = Processes(Path(tempfile.mkdtemp(prefix="cpx-overhead-")))
    try:
        results = run(args, procs, sized)
    except KeyboardInterrupt:
        log("interrupted: stopping the processes this run started")
        return 130
    except (RuntimeError, OSError, ValueError) as exc:
        log(f"error: {exc}")
        return 1
    finally:
        procs.stop_all()
        shutil.rmtree(procs.tmp, ignore_errors=True)
    meta = {
        "when": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_revision(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "bodies_tokens": {s: tokens for s, (tokens, _) in sized.items()},
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    runs = "" if args.skip_matrix else f", {args.reps} reps of {args.duration:g} s"
    title = (
        f"## compaction-proxy pass-through overhead ({meta['when']}, commit {meta['commit']}, "
        f"{meta['cores']} cores{runs}, policy {args.policy or 'default'})"
    )
    markdown = report.markdown(results["cells"], results["ttfb"], args.ttfb, results["sessions"], title)
    print(markdown)
    if args.md_out:
        args.md_out.write_text(markdown)
    if args.json_out:
        args.json_out.write_text(json.dumps({"meta": meta, **results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
