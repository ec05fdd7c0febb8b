"""The tight-windows benchmark's quick mode runs end to end (the real proxy as a process, the
fake provider, the agent loop) and reports every column; no request is refused for the
window. No performance assertion: those numbers are for the benchmark's report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

POLICIES = ("improved", "full")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("tight")
    command = [sys.executable, str(ROOT / "benchmarks" / "tight_windows.py"), "--steps", "20"]
    command += ["--scenarios", "8k", "--policies", ",".join(POLICIES), "--json-out", str(out / "r.json")]
    command += ["--workdir", str(out / "work")]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, orjson.loads(Path(out / "r.json").read_bytes())


def test_one_row_per_policy_with_every_column(report: tuple[str, list[dict[str, Any]]]) -> None:
    markdown, results = report
    assert [(r["scenario"], r["policy"]) for r in results] == [("8k", p) for p in POLICIES]
    header = markdown.splitlines()[0]
    for column in ("agent req", "upstream req", "points", "refused", "cached % prompt", "cost vs full 4o"):
        assert column in header
    for policy in POLICIES:
        assert f"| 8k | {policy} |" in markdown
    for r in results:
        for key in ("compaction_points", "points_per_agent_request", "read_rounds", "read_outcomes"):
            assert key in r
        assert 0 <= r["cached_share"] <= 1 and 0 <= r["conversation_cached_share"] <= 1
        assert set(r["cost"]) == {"gpt-4o", "gpt-4.1", "anthropic"}
        assert r["cost_vs_full"] is not None


def test_the_agent_finishes_and_nothing_is_refused(report: tuple[str, list[dict[str, Any]]]) -> None:
    _, results = report
    for r in results:
        assert r["finished"] and r["steps"] == 20, r["policy"]
        assert r["agent_requests"] == 21
        assert r["refused_for_window"] == 0 and r["agent_errors"] == [], r["policy"]
        assert r["protocol_problems"] == 0 and r["mismatched_commands"] == 0
    full = next(r for r in results if r["policy"] == "full")
    assert full["cost_vs_full"] == {"gpt-4o": 1.0, "gpt-4.1": 1.0, "anthropic": 1.0}
    assert full["compaction_points"] == 0 and full["upstream_requests"] == full["agent_requests"]
