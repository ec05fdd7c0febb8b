"""Replay at scale: wall time and cases per second of ``replay run --jobs N`` against ``--jobs 1``.

Each repetition runs ``compaction-proxy replay run`` once per ``--jobs`` value (the order
rotated from one repetition to the next), each into a fresh run directory, and checks that every
run's ``results.json`` equals the first one's apart from timing and paths. Before each run it
waits (up to ``--quiet-wait`` seconds) for the machine to be idle, and it records the CPU the
run used (its process tree) and the CPU everything else used meanwhile, so a noisy measurement
shows as one: a run during which the rest of the machine used more than ``--max-others`` of
it is done again (up to ``--attempts`` times).

    .venv/bin/python benchmarks/replay_scale.py --input ../shared/data/trajectories.jsonl \\
        --arms full,improved --context-window 16000 --jobs 1,2,3,4 --reps 3 [--md-out FILE]

Traffic stays on 127.0.0.1 (each run starts its own proxies, and stops them).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
TIMING = ("seconds", "finished_at", "input")


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]
    return (sum(fields) - idle) / ticks, sum(fields) / ticks


def idle_share(seconds: float = 1.0) -> float:
    busy0, total0 = machine_cpu()
    time.sleep(seconds)
    busy1, total1 = machine_cpu()
    return 1 - (busy1 - busy0) / max(total1 - total0, 1e-9)


def wait_for_quiet(limit: float, threshold: float = 0.9) -> float:
    deadline = time.monotonic() + limit
    share = idle_share()
    while share < threshold and time.monotonic() < deadline:
        share = idle_share()
    return share


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def comparable(run_dir: Path) -> dict[str, Any]:
    results: dict[str, Any] = orjson.loads((run_dir / "results.json").read_bytes())
    for name in TIMING:
        results["run"].pop(name, None)
    for figures in results["arms"].values():
        figures.pop("seconds", None)
    return results


def run_clean(args: argparse.Namespace, jobs: int, out: Path) -> dict[str, Any]:
    """A run during which the rest of the machine stayed mostly idle (``--max-others``), or
    the last of ``--attempts`` runs (marked by its ``others_share``)."""
    for _ in range(args.attempts):
        shutil.rmtree(out, ignore_errors=True)
        run = run_once(args, jobs, out)
        if run["others_share"] <= args.max_others:
            break
        print(f"jobs {jobs}: others used {run['others_share']:.0%} of the machine: again", file=sys.stderr)
    return run


def run_once(args: argparse.Namespace, jobs: int, out: Path) -> dict[str, Any]:
    quiet = wait_for_quiet(args.quiet_wait)
    command = [
        sys.executable, "-m", "proxy.cli", "replay", "run", "--input", str(args.input),
        "--out", str(out), "--arms", args.arms, "--context-window", str(args.context_window),
        "--jobs", str(jobs), "--no-progress",
    ]  # fmt: skip
    cpu_before, (busy_before, _) = children_cpu(), machine_cpu()
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    own_cpu, busy = children_cpu() - cpu_before, machine_cpu()[0] - busy_before
    if done.returncode != 0:
        raise SystemExit(f"jobs {jobs}: exit {done.returncode}\n{done.stderr[-3000:]}")
    results = orjson.loads((out / "results.json").read_bytes())
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    return {
        "jobs": jobs,
        "wall": round(wall, 2),
        "replay_seconds": manifest["seconds"],
        "cases": results["cases"]["used"],
        "pairs": results["cases"]["used"] * len(results["arms"]),
        "cpu": round(own_cpu, 2),
        "others_cpu": round(max(0.0, busy - own_cpu), 2),
        "others_share": round(max(0.0, busy - own_cpu) / (wall * (os.cpu_count() or 1)), 3),
        "idle_before": round(quiet, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--input", type=Path, default=ROOT.parent / "shared" / "data" / "trajectories.jsonl")
    parser.add_argument("--arms", default="full,improved")
    parser.add_argument("--context-window", type=int, default=16_000)
    parser.add_argument("--jobs", default="1,2,3,4", help="comma-separated --jobs values")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--quiet-wait", type=float, default=120.0, help="most seconds to wait for an idle machine"
    )
    parser.add_argument(
        "--max-others", type=float, default=0.1, help="redo a run when others used more of the machine"
    )
    parser.add_argument("--attempts", type=int, default=5, help="most runs per measurement")
    parser.add_argument("--md-out", type=Path)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    values = [int(v) for v in args.jobs.split(",")]
    runs: list[dict[str, Any]] = []
    reference: dict[str, Any] | None = None
    identical = True
    with tempfile.TemporaryDirectory(prefix="replay-scale-") as scratch:
        for rep in range(args.reps):
            order = values[rep % len(values) :] + values[: rep % len(values)]
            for jobs in order:
                out = Path(scratch) / f"jobs{jobs}-rep{rep}"
                run = run_clean(args, jobs, out)
                runs.append(run)
                print(orjson.dumps(run).decode(), file=sys.stderr)
                results = comparable(out)
                if reference is None:
                    reference = results
                elif results != reference:
                    identical = False
                    print(f"jobs {jobs} rep {rep}: results differ from the first run's", file=sys.stderr)
    report = table(runs, values, identical)
    print(report)
    if args.md_out:
        args.md_out.write_text(report)
    if args.json_out:
        args.json_out.write_bytes(
            orjson.dumps({"runs": runs, "identical": identical}, option=orjson.OPT_INDENT_2)
        )
    return 0 if identical else 1


def table(runs: list[dict[str, Any]], values: list[int], identical: bool) -> str:
    base = statistics.median(r["wall"] for r in runs if r["jobs"] == values[0])
    lines = [
        "| --jobs | wall s (median, min-max) | replay s | cases/s | (arm, case)/s | speed-up "
        "| CPU s | others' share |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for jobs in values:
        mine = [r for r in runs if r["jobs"] == jobs]
        wall = statistics.median(r["wall"] for r in mine)
        lines.append(
            f"| {jobs} | {wall:.2f} ({min(r['wall'] for r in mine):.2f}-{max(r['wall'] for r in mine):.2f}) "
            f"| {statistics.median(r['replay_seconds'] for r in mine):.2f} "
            f"| {mine[0]['cases'] / wall:.2f} | {mine[0]['pairs'] / wall:.2f} | {base / wall:.2f}x "
            f"| {statistics.median(r['cpu'] for r in mine):.1f} "
            f"| {max(r['others_share'] for r in mine):.0%} |"
        )
    lines.append("")
    lines.append(
        f"results identical across every run (timing and paths aside): {'yes' if identical else 'NO'}"
    )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
