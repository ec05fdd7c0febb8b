"""Compaction points that cost the agent nothing: a growing agent session through several
compaction points with a slow model summarizer, with summaries prepared ahead
(``summarizer.prepare_at``) and without, side by side in one run.

The agent's model (``fake_upstream.py``) answers each step after ``--model-ms``; the summarizer
(a second ``fake_upstream.py``, any OpenAI-compatible chat endpoint; ``--summarizer-url`` takes
a real one, such as the llama.cpp server with SmolLM2) after ``--summarizer-ms``. Each step
adds a tool call and its ~600-token output at an 8k window (policy ``improved``), so a point
comes every few steps. Reports what the proxy added to each step (the client's time minus the
model's wait): steady steps and compaction points, whether each point's summary was prepared,
and the summarizer's calls.

    .venv/bin/python benchmarks/prepared_summary.py --steps 24 --model-ms 2000 --summarizer-ms 5000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from processes import Processes, free_port

KEY = "sk-bench-prepared-000000000000"


def step(i: int) -> list[dict[str, Any]]:
    output = "\n".join(f"check {i} line {n}: scanned module_{i}.py, all good" for n in range(60))
    call = {"id": f"c{i}", "type": "function", "function": {"name": "run", "arguments": f'{{"n": {i}}}'}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{i}", "content": output},
    ]


def drive(port: int, steps: int, model_seconds: float, session: str) -> list[tuple[float, str | None]]:
    """Each step's time the proxy added (ms) and its compaction trigger."""
    messages: list[Any] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Run every check and report."},
    ]
    added = []
    with httpx.Client(timeout=120) as client:
        for i in range(steps):
            messages += step(i)
            started = time.perf_counter()
            answer = client.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                json={"model": "gpt-4o", "messages": messages},
                headers={"authorization": f"Bearer {KEY}", "x-session-id": session},
            )
            answer.raise_for_status()
            spent = time.perf_counter() - started - model_seconds
            added.append((spent * 1000, answer.headers.get("x-compaction-trigger")))
    return added


def point_status(port: int, session: str) -> list[str]:
    events = httpx.get(
        f"http://127.0.0.1:{port}/v1/compaction/events",
        params={"session": session},
        headers={"authorization": f"Bearer {KEY}"},
    ).json()["data"]
    return [
        f"{e['summary']['model']}/{e['summary'].get('prepared') or 'waited'}"
        for e in events
        if e["trigger"] and e["summary"]
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--model-ms", type=float, default=2000)
    parser.add_argument("--summarizer-ms", type=float, default=5000)
    parser.add_argument(
        "--summarizer-url", help="a real OpenAI-compatible endpoint (.../v1) instead of the fake"
    )
    parser.add_argument("--summarizer-model", default="small-model")
    parser.add_argument("--prepare-at", type=float, default=0.5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cpx-prepared-") as tmp:
        processes = Processes(Path(tmp))
        try:
            upstream = free_port()
            processes.start_upstream(upstream, chunks=4, chunk_interval_ms=0, delay_ms=args.model_ms)
            summarizer_url = args.summarizer_url
            if summarizer_url is None:
                summarizer = free_port()
                argv = [
                    sys.executable,
                    str(Path(__file__).parent / "fake_upstream.py"),
                    "--host",
                    "127.0.0.1",
                ]
                argv += ["--port", str(summarizer), "--delay-ms", str(args.summarizer_ms)]
                log = Path(tmp) / "summarizer.log"
                processes.start(
                    "summarizer", argv, lambda: log.exists() and b"listening on" in log.read_bytes()
                )
                summarizer_url = f"http://127.0.0.1:{summarizer}/v1"
            rows = []
            for name, prepare_at in (("prepared ahead", args.prepare_at), ("waits (prepare_at: null)", None)):
                config = {
                    "policy": "improved",
                    "context_windows": {"default": 8000},
                    "summarizer": {
                        "kind": "openai",
                        "base_url": summarizer_url,
                        "api_key": "sk-summarizer",
                        "model": args.summarizer_model,
                        "prepare_at": prepare_at,
                        "timeout": 120,
                    },
                }
                port, pid = processes.start_proxy(upstream, config, name=name.split()[0])
                added = drive(port, args.steps, args.model_ms / 1000, session=name.split()[0])
                statuses = point_status(port, name.split()[0])
                processes.stop(pid)
                steady = [ms for ms, trigger in added if not trigger]
                points = [ms for ms, trigger in added if trigger]
                rows.append((name, statistics.median(steady), points, statuses))
        finally:
            processes.stop_all()
    summarizer = args.summarizer_url or f"a fake taking {args.summarizer_ms:.0f} ms"
    waits = f"model {args.model_ms:.0f} ms per step, summarizer {summarizer}"
    print(f"\n{args.steps} steps, {waits}\n")
    print("| summarizer | steady step added, p50 ms | compaction points added, ms | each point's summary |")
    print("|---|---:|---|---|")
    for name, steady, points, statuses in rows:
        shown = ", ".join(f"{ms:.0f}" for ms in points)
        print(f"| {name} | {steady:.1f} | {shown} | {', '.join(statuses)} |")


if __name__ == "__main__":
    main()
