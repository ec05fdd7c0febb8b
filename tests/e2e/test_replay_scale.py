"""Replay at scale, end to end: ``replay run --jobs N`` (worker processes, each with its own
recorded upstream and proxy) and ``replay run --shard K/N`` + ``replay merge`` give the results
of one ``--jobs 1`` run, apart from timing and paths."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from tests.conftest import ROOT
from tests.fake_upstream import free_port

pytestmark = pytest.mark.e2e

SAMPLE = ROOT / "tests" / "fixtures" / "trajectories_sample.jsonl"
RUN = ("--input", str(SAMPLE), "--arms", "full,n_latest_10,improved", "--context-window", "8000")


def replay(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "proxy.cli", "replay", *args]
    if args[0] == "run":
        command.append("--no-progress")
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)


def comparable(run_dir: Path) -> dict[str, Any]:
    """results.json without what may differ between equal runs: timing and the input's path."""
    results: dict[str, Any] = orjson.loads((run_dir / "results.json").read_bytes())
    for name in ("seconds", "finished_at", "input"):
        results["run"].pop(name)
    for figures in results["arms"].values():
        figures.pop("seconds")
    return results


def summary_without_timing(run_dir: Path) -> str:
    return re.sub(r"; [0-9.]+ s\.", "; _ s.", (run_dir / "summary.md").read_text())


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("scale") / "single"
    done = replay("run", *RUN, "--out", str(out), "--jobs", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_jobs_give_the_results_of_one_process(single: Path, tmp_path: Path) -> None:
    out = tmp_path / "jobs"
    done = replay("run", *RUN, "--out", str(out), "--jobs", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert comparable(out) == comparable(single)
    assert summary_without_timing(out) == summary_without_timing(single)
    assert comparable(out)["arms"]["improved"]["compaction_events"] > 0
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    workers = manifest["workers"]
    assert [w["worker"] for w in workers] == [1, 2] and sum(w["pairs"] for w in workers) == 15
    assert manifest["finished"] is True and manifest["unexpected_upstream_requests"] == 0
    for number in (1, 2):
        assert (out / f"worker-{number}" / "proxy-state").is_dir()
    # Resumed with another --jobs: every part is reused, nothing is replayed again.
    parts = {p: p.stat().st_mtime_ns for p in (out / "parts").rglob("*.json")}
    done = replay("run", *RUN, "--out", str(out), "--jobs", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    assert {p: p.stat().st_mtime_ns for p in parts} == parts
    assert comparable(out) == comparable(single)


def test_merged_shards_give_the_results_of_one_run(single: Path, tmp_path: Path) -> None:
    first, second, merged = tmp_path / "shard1", tmp_path / "shard2", tmp_path / "merged"
    done = replay("run", *RUN, "--out", str(first), "--shard", "1/2", "--jobs", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    done = replay("run", *RUN, "--out", str(second), "--shard", "2/2")
    assert done.returncode == 0, done.stdout + done.stderr
    shard = orjson.loads((second / "results.json").read_bytes())
    assert shard["run"]["shard"] == "2/2" and shard["cases"]["used"] == 2
    done = replay("merge", "--out", str(merged), str(first), str(second))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "warning" not in done.stderr
    assert comparable(merged) == comparable(single)
    assert summary_without_timing(merged) == summary_without_timing(single)
    assert (merged / "report.html").read_text().count("<svg") > 0

    # One shard alone: merged with a warning, results of its cases, no release gate.
    alone = tmp_path / "alone"
    done = replay("merge", "--out", str(alone), str(first))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "warning: incomplete: shard 2 of 2 missing" in done.stderr
    results = orjson.loads((alone / "results.json").read_bytes())
    assert results["run"]["shard"] == "1/2" and results["cases"]["used"] == 3

    # A shard of another run (another window) is refused, naming what differs.
    other = tmp_path / "other"
    done = replay("run", *RUN[:-1], "9000", "--out", str(other), "--shard", "2/2", "--limit", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    done = replay("merge", "--out", str(tmp_path / "bad"), str(first), str(other))
    assert done.returncode == 2 and "not parts of one run" in done.stderr


def test_bad_jobs_and_shards_are_clear_errors(tmp_path: Path) -> None:
    done = replay("run", *RUN, "--out", str(tmp_path / "a"), "--shard", "3/2")
    assert done.returncode == 2 and "--shard 3/2" in done.stderr
    done = replay(
        "run", *RUN, "--out", str(tmp_path / "b"), "--jobs", "2",
        "--proxy-url", "http://127.0.0.1:9", "--upstream-port", "9",
    )  # fmt: skip
    assert done.returncode == 2 and "--jobs" in done.stderr
    done = replay("merge", "--out", str(tmp_path / "m"), str(tmp_path))
    assert done.returncode == 2 and "no manifest.json" in done.stderr


def test_a_failed_worker_fails_the_run_and_leaves_no_process(tmp_path: Path) -> None:
    # A store the proxies cannot reach: every worker's proxy exits before it starts.
    config = tmp_path / "proxy.yml"
    config.write_text(
        yaml.safe_dump({"store": {"backend": "redis", "redis_url": f"redis://127.0.0.1:{free_port()}/0"}})
    )
    out = tmp_path / "run"
    done = replay("run", *RUN, "--out", str(out), "--jobs", "2", "--config", str(config))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "replay workers failed" in done.stderr and "run again to resume" in done.stderr
    assert orjson.loads((out / "manifest.json").read_bytes())["finished"] is False
    leftovers = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(out).encode() in cmdline.read_bytes():
                leftovers.append(cmdline.parent.name)
        except OSError:
            continue
    assert leftovers == []
