"""`compaction-proxy replay run --dialect ...` as a user runs it, on every door: the Gemini API's
(the model in the path) and Code Assist's as the others. A run through a door gives the figures
of the same run through chat (steps in shadow mode too), and model arms answer through every
door as through chat: the answering model (a chat model behind the recorded upstream) reads
saved outputs back through the door, and its answers, read back from the door's own answer
format, are the same."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from tests.conftest import ProxyProcess
from tests.e2e.test_replay import SAMPLE, replay, scripted_model
from tests.fake_upstream import FakeUpstream, Reply, free_port

pytestmark = pytest.mark.e2e

DOORS = ("responses", "anthropic", "gemini", "code_assist")


def results_of(out: Path, done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stdout + done.stderr
    results: dict[str, Any] = orjson.loads((out / "results.json").read_bytes())
    return results


def figures(results: dict[str, Any]) -> dict[str, Any]:
    return {
        name: (arm["compaction_events"], arm["survival_all"], arm["protocol_violations"], arm["errors"])
        for name, arm in results["arms"].items()
    }


@pytest.mark.parametrize("mode", ["enforce", "shadow"])
def test_a_gemini_run_gives_the_figures_of_the_same_run_through_chat(tmp_path: Path, mode: str) -> None:
    runs = {}
    for door in ("chat", "gemini"):
        out = tmp_path / door
        done = replay(
            "run", "--input", str(SAMPLE), "--out", str(out), "--arms", "full,improved",
            "--context-window", "8000", "--mode", mode, "--limit", "3", "--dialect", door,
        )  # fmt: skip
        runs[door] = results_of(out, done)
    chat, gemini = runs["chat"], runs["gemini"]
    assert gemini["run"]["config"]["dialect"] == "gemini"
    assert figures(gemini) == figures(chat)
    assert gemini["arms"]["improved"]["compaction_events"] > 0
    for arm in ("full", "improved"):
        assert abs(gemini["arms"][arm]["reduction"] - chat["arms"][arm]["reduction"]) < 0.01
    # The table a user reads has the same rows.
    assert "improved" in (tmp_path / "gemini" / "summary.md").read_text()


def test_replay_through_a_gemini_door_of_a_proxy_the_user_runs(tmp_path: Path) -> None:
    """The given proxy sends Google's doors to the recorded upstream: ``gemini.base_url`` at its
    root (the client's path holds the version)."""
    port = free_port()
    root = f"http://127.0.0.1:{port}"
    config = {"upstream": {"base_url": root + "/v1"}, "gemini": {"base_url": root, "code_assist_url": root}}
    proxy = ProxyProcess(config, tmp_path)
    proxy.start()
    try:
        done = replay(
            "run", "--input", str(SAMPLE), "--out", str(tmp_path / "run"), "--arms", "full,improved",
            "--proxy-url", proxy.url, "--upstream-port", str(port), "--limit", "2", "--dialect", "gemini",
        )  # fmt: skip
    finally:
        proxy.stop()
    results = results_of(tmp_path / "run", done)
    assert results["cases"]["used"] == 2 and results["arms"]["improved"]["requests"] > 0


def answers(results: dict[str, Any]) -> list[tuple[str, str, int, Any, bool]]:
    return [
        (q["arm"], q["question_id"], a["repeat"], a["error"], a["exact"]["correct"])
        for q in results["questions"]
        for a in q.get("answers") or []
    ]


def test_model_arms_answer_through_every_door_as_through_chat(tmp_path: Path, upstream: FakeUpstream) -> None:
    endpoint = {"base_url": upstream.base_url, "model": "scripted"}
    config = tmp_path / "replay.yml"
    models = {"answer_model": endpoint, "judge_model": endpoint, "repeats": 1, "noise_floor": False}
    config.write_text(yaml.safe_dump({"arms": ["full", "improved"], "context_window": 8000, **models}))
    runs = {}
    for door in ("chat", *DOORS):
        upstream.reset()
        upstream.queue(*[Reply(dynamic=scripted_model(True)) for _ in range(1000)])
        out = tmp_path / door
        done = replay(
            "run", "--input", str(SAMPLE), "--out", str(out), "--replay-config", str(config),
            "--limit", "3", "--dialect", door,
        )  # fmt: skip
        runs[door] = results_of(out, done)
    reference = answers(runs["chat"])
    assert reference and all(error is None for _, _, _, error, _ in reference)
    assert any(correct for *_, correct in reference)
    for door in DOORS:
        assert answers(runs[door]) == reference, door
        # Where improved offloaded, the model read outputs back through the door.
        assert runs[door]["arms"]["improved"]["retrieval_rounds"] > 0, door
