"""CPU per agent step, in process: the load's sessions through the app over ASGI, no sockets.

``load.py``'s sessions (a task, then each step an assistant tool call and a ~800-token tool
output, streamed answers, a 16k window) go through the whole app (edge, route, service,
policy, read loop, writer, observers, store) with the upstream mocked by ``httpx``; every
session takes step 1, then step 2, and so on. Reports the process CPU per request (the test
client's share included, the same for every checkout).

This machine's speed drifts within minutes, so two checkouts are compared by running them at
the same time, one per core (``--compare DIR``): both see the same machine. Even so, two runs
of one checkout differ by a tenth or more; ``--instructions`` counts instead the instructions
each step executes, under valgrind's callgrind (Debian's ``valgrind``; about 60 times slower,
so fewer sessions): the same code gives the same count to a few parts in ten thousand, so a
change of 1% shows. A run of 1 step is subtracted (start-up, imports); the test client's
share is included, the same for every checkout.

    .venv/bin/python benchmarks/step_cpu.py --policy improved
    .venv/bin/python benchmarks/step_cpu.py --compare /tmp/base-worktree --rounds 3
    .venv/bin/python benchmarks/step_cpu.py --compare /tmp/base-worktree --instructions --sessions 20
    .venv/bin/python benchmarks/step_cpu.py --instructions --sessions 20 --step 27  # request 28 alone
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def sse_answer() -> bytes:
    import orjson

    def chunk(delta: dict[str, Any]) -> bytes:
        event = {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}
        return b"data: " + orjson.dumps(event) + b"\n\n"

    end = {
        "id": "x",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 6, "total_tokens": 16},
    }
    words = b"".join(chunk({"content": "word "}) for _ in range(6))
    return (
        chunk({"role": "assistant", "content": ""})
        + words
        + b"data: "
        + orjson.dumps(end)
        + b"\n\ndata: [DONE]\n\n"
    )


async def measure(sessions: int, steps: int, policy: str) -> float:
    """CPU milliseconds per request of the checkout this process imports from."""
    import httpx
    import orjson
    from load import output_text

    from proxy.app import create_app
    from proxy.config.settings import load_settings
    from proxy.telemetry.logs import configure_logging

    try:
        from proxy.serving import tune_gc
    except ImportError:  # a checkout from before the collector was tuned
        tune_gc = None

    # As load.py runs the proxy: warnings only (the access log line is not rendered).
    configure_logging("warning", "json", open(os.devnull, "wb"))  # noqa: SIM115
    answer = sse_answer()

    def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=answer, headers={"content-type": "text/event-stream"})

    with tempfile.TemporaryDirectory() as tmp:
        overrides = {"state_dir": tmp, "policy": policy, "context_windows": {"default": 16_000}}
        app = create_app(
            load_settings(env={}, overrides={**overrides, "upstream.http_client": "httpx"}),
            transport=httpx.MockTransport(upstream),
        )
        rngs = [random.Random(i) for i in range(sessions)]
        system = {"role": "system", "content": "You are a coding agent. " * 50}
        histories: list[list[dict[str, Any]]] = [
            [system, {"role": "user", "content": f"Task {i}: fix the failing test."}] for i in range(sessions)
        ]
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            await client.get("/readyz")
            if tune_gc is not None:
                tune_gc()
            spent, requests = 0.0, 0
            for step in range(steps):
                for i in range(sessions):
                    body = orjson.dumps({"model": "gpt-4o", "messages": histories[i], "stream": True})
                    headers = {"authorization": "Bearer sk-load", "x-session-id": f"load-{i}"}
                    started = time.process_time()
                    response = await client.post("/v1/chat/completions", content=body, headers=headers)
                    await response.aread()
                    spent += time.process_time() - started
                    requests += 1
                    if response.status_code != 200:
                        raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
                    call_id = f"call_{step}"
                    arguments = orjson.dumps({"command": f"pytest -k test_{step}"}).decode()
                    call = {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "bash", "arguments": arguments},
                    }
                    histories[i] = [
                        *histories[i],
                        {"role": "assistant", "content": None, "tool_calls": [call]},
                        {"role": "tool", "tool_call_id": call_id, "content": output_text(rngs[i])},
                    ]
        return spent * 1000 / requests


def run_one(args: argparse.Namespace) -> None:
    root = Path(args.root).resolve()
    sys.path[:0] = [str(root), str(ROOT / "benchmarks")]
    os.chdir(root)
    print(f"{asyncio.run(measure(args.sessions, args.steps, args.policy)):.3f}")


def child(root: Path, args: argparse.Namespace, steps: int | None = None) -> subprocess.Popen[str]:
    argv = [sys.executable, __file__, "--root", str(root), "--sessions", str(args.sessions)]
    argv += ["--steps", str(steps or args.steps), "--policy", args.policy]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPACTION_PROXY_", "CPX_"))}
    if args.instructions:
        argv = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv]
        env["PYTHONHASHSEED"] = "0"  # the same dict layouts in every run
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def instructions(run: subprocess.Popen[str]) -> int:
    """The instructions callgrind counted in a finished run."""
    _, err = run.communicate()
    found = re.search(r"Collected : (\d+)", err)
    if run.returncode or found is None:
        raise RuntimeError(f"the run failed (exit {run.returncode}): {err[-500:]}")
    return int(found.group(1))


def per_step_instructions(roots: dict[str, Path], args: argparse.Namespace) -> list[str]:
    """Millions of instructions per request after the first step, each checkout's pair of runs
    (all steps, and 1 step) at the same time."""
    runs = {
        (name, steps): child(root, args, steps) for name, root in roots.items() for steps in (args.steps, 1)
    }
    counts = {key: instructions(run) for key, run in runs.items()}
    requests = args.sessions * (args.steps - 1)
    return [f"{(counts[name, args.steps] - counts[name, 1]) / requests / 1e6:.3f}" for name in roots]


def one_step_instructions(roots: dict[str, Path], args: argparse.Namespace) -> list[str]:
    """Millions of instructions of request ``args.step + 1`` of each session alone (a step
    before, at or after a compaction point): runs of that many steps and one fewer."""
    runs = {
        (name, steps): child(root, args, steps)
        for name, root in roots.items()
        for steps in (args.step + 1, args.step)
    }
    counts = {key: instructions(run) for key, run in runs.items()}
    return [
        f"{(counts[name, args.step + 1] - counts[name, args.step]) / args.sessions / 1e6:.3f}"
        for name in roots
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="improved")
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compare", metavar="DIR", help="another checkout, run at the same time")
    parser.add_argument("--instructions", action="store_true", help="count instructions (valgrind)")
    parser.add_argument(
        "--step", type=int, help="with --instructions: request STEP+1 of each session alone (STEP >= 1)"
    )
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.root:
        run_one(args)
        return 0
    roots = {"this": ROOT, **({"other": Path(args.compare)} if args.compare else {})}
    if args.step is not None and (not args.instructions or args.step < 1):
        parser.error("--step needs --instructions and a step of 1 or more")
    unit = "million instructions per request" if args.instructions else "CPU ms per request"
    if args.step is not None:
        unit += f" (request {args.step + 1} of each session)"
    print(f"policy {args.policy}, {args.sessions} sessions x {args.steps} steps, {unit}\n")
    print("| round | " + " | ".join(roots) + " |\n|---:|" + "---:|" * len(roots))
    for round_number in range(1, (1 if args.instructions else args.rounds) + 1):
        if args.step is not None:
            figures = one_step_instructions(roots, args)
        elif args.instructions:
            figures = per_step_instructions(roots, args)
        else:
            runs = {name: child(root, args) for name, root in roots.items()}
            figures = [runs[name].communicate()[0].strip() for name in roots]
        print(f"| {round_number} | " + " | ".join(figures) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
