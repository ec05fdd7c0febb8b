"""Replicas behind a real load balancer: agent steps per second and proxy CPU per step for 1, 2
and 3 proxy processes on one Redis behind HAProxy (round robin), the same agents each time.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/replicas.py [--sessions 100] [--steps 8]

Each run: a fresh Redis, N replicas and HAProxy (``tests/replicas_cluster.py``), the scripted
model of the end-to-end tests (``tests/agent_upstream``) in this process, ``sessions`` agents at
once through the balancer (the OpenAI SDK), canary mode as in the faults test. CPU is the user
and system time of every proxy process and its children, from ``/proc``, over the run; the
driver's CPU is this process's (the scripted model and the agents). Prints a Markdown table.
On a machine with fewer cores than replicas the scaling is for the record: the model, the
agents and the replicas share the cores."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.processes import CLK_TCK, tree_ticks  # noqa: E402
from tests.agent_upstream import AgentUpstream  # noqa: E402
from tests.replicas_cluster import ADMIN, Cluster, run_agents  # noqa: E402

CONFIG: dict[str, Any] = {
    "policy": "improved",
    "mode": "canary",
    "context_windows": {"default": 4096},
    "canary": {"share": 0.5, "evaluate_every_seconds": 0.5, "gate": {"min_sessions": 1000}},
    "server": {"admin_token": ADMIN},
}
LINES = 40


def measure(replicas: int, sessions: int, steps: int) -> dict[str, float]:
    """One run through ``replicas`` replicas: steps, seconds, proxy CPU seconds."""
    model = AgentUpstream(window=32768, steps=steps, read_every=2, output_lines=LINES).start()
    try:
        with tempfile.TemporaryDirectory(prefix="cpx-replicas-") as directory:
            cluster = Cluster(Path(directory), model.base_url, replicas, CONFIG)
            try:
                cluster.start()
                pids = cluster.pids()
                before = sum(tree_ticks(pid) for pid in pids)
                started, driver = time.monotonic(), time.process_time()
                runs = asyncio.run(run_agents(cluster.base_url, sessions, steps, LINES))
                took, driver = time.monotonic() - started, time.process_time() - driver
                cpu = (sum(tree_ticks(pid) for pid in pids) - before) / CLK_TCK
            finally:
                cluster.stop()
    finally:
        model.stop()
    done = sum(r.steps_done for r in runs)
    finished = sum(r.finished for r in runs)
    return {
        "replicas": replicas,
        "steps": done,
        "finished": finished,
        "seconds": took,
        "cpu": cpu,
        "driver": driver,
    }


def table(rows: list[dict[str, float]], sessions: int) -> str:
    lines = [
        "| replicas | sessions | steps | finished | seconds | steps/s | proxy CPU s | CPU ms/step "
        "| driver CPU s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['replicas']:.0f} | {sessions} | {row['steps']:.0f} | {row['finished']:.0f} "
            f"| {row['seconds']:.1f} | {row['steps'] / row['seconds']:.1f} | {row['cpu']:.1f} "
            f"| {1000 * row['cpu'] / row['steps']:.1f} | {row['driver']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 3])
    args = parser.parse_args(argv)
    rows = [measure(n, args.sessions, args.steps) for n in args.replicas]
    print(table(rows, args.sessions))
    return 0 if all(row["finished"] == args.sessions for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
