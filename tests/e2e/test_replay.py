"""The replay harness end to end: `compaction-proxy replay ...` as a user runs it.

Each run starts the real proxy as a child process and the recorded upstream in the harness;
model arms talk to a scripted OpenAI-compatible fake model on loopback.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from tests.conftest import ROOT, ProxyProcess
from tests.fake_upstream import FakeUpstream, Recorded, Reply, completion

pytestmark = pytest.mark.e2e

SAMPLE = ROOT / "tests" / "fixtures" / "trajectories_sample.jsonl"
ARMS = "full,n_latest_10,improved"


def replay(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "proxy.cli",
            "replay",
            *args,
            *(["--no-progress"] if args[0] == "run" else []),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("replay") / "run"
    done = replay(
        "run", "--input", str(SAMPLE), "--out", str(out), "--arms", ARMS, "--context-window", "8000"
    )
    return out, done


def test_run_writes_the_documented_results(first_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, done = first_run
    assert done.returncode == 0, done.stderr
    results = orjson.loads((out / "results.json").read_bytes())
    assert set(results["arms"]) == set(ARMS.split(","))
    assert results["cases"]["used"] == 5 and results["cases"]["rejected"] == {}
    for name, arm in results["arms"].items():
        for key in ("requests", "protocol_violations", "summarizer_calls", "compaction_events"):
            assert isinstance(arm[key], int), (name, key)
        assert arm["protocol_violations"] == 0 and arm["errors"] == 0
        assert isinstance(arm["tokens_before_mean"], float) and isinstance(arm["tokens_after_mean"], float)
        assert arm["requests"] == results["arms"]["full"]["requests"] > 0
        for kind, counts in arm["survival"].items():
            assert set(counts) == {"visible", "recoverable", "lost"}
            assert sum(counts.values()) == results["cases"]["questions"][kind]
    full, improved = results["arms"]["full"], results["arms"]["improved"]
    assert full["reduction"] == 0.0 and full["survival_all"]["lost"] == 0
    assert improved["reduction"] > 0.2 and improved["compaction_events"] > 0
    assert improved["summarizer"].startswith("ledger")
    # Offline, summaries come from the model-free ledger: counted, labelled, no model call.
    assert improved["summarizer_model_calls"] == 0
    assert results["arms"]["n_latest_10"]["survival_all"]["lost"] > 0
    assert results["run"]["context_window"] == 8000
    assert results["run"]["input_sha256"] and results["run"]["policies"]["improved"]["stages"]
    questions = results["questions"]
    assert {q["kind"] for q in questions} <= {"files_changed", "first_edit", "command_output", "error"}
    assert all(q["survival"] in ("visible", "recoverable", "lost") for q in questions)
    assert all(q["evidence"] and q["reference"] for q in questions)
    summary = (out / "summary.md").read_text()
    assert "| improved |" in summary
    page = (out / "report.html").read_text()
    assert "<svg" in page and "<script" not in page
    assert "improved" in done.stdout and "reduction" in done.stdout


def test_a_second_run_resumes_from_saved_parts(
    first_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, _ = first_run
    parts = sorted((out / "parts").rglob("*.json"))
    before = {p: p.stat().st_mtime_ns for p in parts}
    figures = orjson.loads((out / "results.json").read_bytes())["arms"]
    done = replay(
        "run", "--input", str(SAMPLE), "--out", str(out), "--arms", ARMS, "--context-window", "8000"
    )
    assert done.returncode == 0, done.stderr
    assert {p: p.stat().st_mtime_ns for p in parts} == before
    again = orjson.loads((out / "results.json").read_bytes())["arms"]
    for name in figures:
        figures[name].pop("seconds"), again[name].pop("seconds")
    assert again == figures
    # A changed setting is a different run: nothing is reused.
    done = replay(
        "run", "--input", str(SAMPLE), "--out", str(out), "--arms", "full", "--context-window", "9000"
    )
    assert done.returncode == 0, done.stderr
    assert any(p.stat().st_mtime_ns != before[p] for p in parts if p.parent.name == "full")


def test_the_release_gate_fails_the_run(tmp_path: Path) -> None:
    config = tmp_path / "replay.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "gate": {
                    "arms": ["n_latest_10", "improved"],
                    "min_reduction": 0.3,
                    "max_survival_drop": {"default": 0.0},
                }
            }
        )
    )
    out = tmp_path / "run"
    done = replay(
        "run", "--input", str(SAMPLE), "--out", str(out), "--arms", ARMS,
        "--context-window", "8000", "--replay-config", str(config),
    )  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
    assert "release gate: FAILED" in done.stdout
    assert re.search(r"n_latest_10: FAIL: survival of \w+ .* below full's", done.stdout)
    results = orjson.loads((out / "results.json").read_bytes())
    assert results["gate"]["verdicts"]["n_latest_10"]["passed"] is False


def test_unknown_arm_and_bad_config_are_clear_errors(tmp_path: Path) -> None:
    done = replay("run", "--input", str(SAMPLE), "--out", str(tmp_path / "r"), "--arms", "nope")
    assert done.returncode == 2 and "arms not defined in the proxy configuration: nope" in done.stderr
    config = tmp_path / "bad.yml"
    config.write_text("arms: [full]\nrepeats: many\n")
    done = replay("run", "--input", str(SAMPLE), "--out", str(tmp_path / "r"), "--replay-config", str(config))
    assert done.returncode == 2 and "repeats" in done.stderr


def test_replay_through_a_proxy_the_user_runs(tmp_path: Path) -> None:
    from tests.fake_upstream import free_port

    port = free_port()
    proxy = ProxyProcess({"upstream": {"base_url": f"http://127.0.0.1:{port}/v1"}}, tmp_path)
    proxy.start()
    try:
        done = replay(
            "run", "--input", str(SAMPLE), "--out", str(tmp_path / "run"), "--arms", "full,improved",
            "--proxy-url", proxy.url, "--upstream-port", str(port), "--limit", "2",
        )  # fmt: skip
    finally:
        assert proxy.process is not None
        proxy.process.terminate()
        proxy.process.wait(10)
    assert done.returncode == 0, done.stdout + done.stderr
    results = orjson.loads((tmp_path / "run" / "results.json").read_bytes())
    assert results["cases"]["used"] == 2 and results["arms"]["improved"]["requests"] > 0
    # Without the recorded upstream's port the given proxy could not be reached back.
    done = replay("run", "--input", str(SAMPLE), "--out", str(tmp_path / "x"), "--proxy-url", proxy.url)
    assert done.returncode == 2 and "--upstream-port" in done.stderr


# --- model arms ---------------------------------------------------------------------------

HANDLE = re.compile(r"handle=['\"]?(out_[0-9a-f]{16})")


def view_text(messages: list[dict[str, Any]]) -> str:
    parts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list) and all(isinstance(p, dict) and "text" in p for p in content):
            content = "\n".join(p["text"] for p in content)  # text parts, as other doors send them
        parts.append(content if isinstance(content, str) else orjson.dumps(content).decode())
        for call in message.get("tool_calls") or []:
            parts.append(orjson.dumps(orjson.loads(call["function"]["arguments"] or "{}")).decode())
    return "\n".join(parts)


def scripted_model(verdict: bool) -> Any:
    """An answerer with perfect recall of its view (it answers with all of it), which reads
    one saved output when the view names a handle; and a judge with a fixed verdict."""

    def reply(request: Recorded) -> Reply:
        body = request.json()
        messages = body["messages"]
        last = str(messages[-1].get("content"))
        if last.startswith("You grade an answer"):
            return Reply(body=completion(orjson.dumps({"correct": verdict, "reason": "scripted"}).decode()))
        tools = {t["function"]["name"] for t in body.get("tools") or []}
        already_read = any(
            c["function"]["name"] == "read_tool_output" for m in messages for c in m.get("tool_calls") or []
        )
        handles = HANDLE.findall(view_text(messages))
        if "read_tool_output" in tools and handles and not already_read:
            call = {
                "id": "call_read",
                "type": "function",
                "function": {
                    "name": "read_tool_output",
                    "arguments": orjson.dumps({"handle": handles[0]}).decode(),
                },
            }
            return Reply(
                body={**completion(tool_calls=[call]), "usage": {"prompt_tokens": 10, "completion_tokens": 5}}
            )
        answer = view_text(messages)[-20_000:]
        return Reply(body={**completion(answer), "usage": {"prompt_tokens": 100, "completion_tokens": 50}})

    return reply


def test_model_arms_answer_judge_and_rescore(tmp_path: Path, upstream: FakeUpstream) -> None:
    upstream.queue(*[Reply(dynamic=scripted_model(True)) for _ in range(2000)])
    endpoint = {"base_url": upstream.base_url, "model": "scripted"}
    config = tmp_path / "replay.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "arms": ["full", "improved"],
                "answer_model": endpoint,
                "judge_model": endpoint,
                "repeats": 2,
                "context_window": 8000,
                "gate": {
                    "arms": ["improved"],
                    "max_retrieval_calls_per_case": 50,
                    "max_survival_drop": {"default": 1.0},
                },
            }
        )
    )
    out = tmp_path / "run"
    done = replay(
        "run", "--input", str(SAMPLE), "--out", str(out), "--replay-config", str(config), "--limit", "3"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = orjson.loads((out / "results.json").read_bytes())
    full = results["arms"]["full"]
    assert set(full["accuracy"]) == {"full", "full_repeat"}  # A/A': the noise floor
    assert full["accuracy"]["full"]["exact"]["all"]["repeats"] == 2
    assert full["accuracy"]["full"]["judge"]["all"]["mean"] == 1.0
    questions = [q for q in results["questions"] if q["arm"] == "improved"]
    answers = [a for q in questions for a in q["answers"]]
    assert len(answers) == 2 * len(questions)
    assert all(a["judge"]["reason"] == "scripted" and a["judge"]["correct"] is True for a in answers)
    assert all("found" in a["exact"] for a in answers)
    # Where improved offloaded, the model read the output back through the proxy.
    assert results["arms"]["improved"]["retrieval_rounds"] > 0
    assert any(a["retrieval_rounds"] > 0 for a in answers)
    assert "Answer accuracy" in (out / "summary.md").read_text()

    # A common judge re-grades the stored answers without asking the model again.
    upstream.reset()
    upstream.queue(*[Reply(dynamic=scripted_model(False)) for _ in range(2000)])
    done = replay(
        "rescore", "--run", str(out), "--judge-url", upstream.base_url, "--judge-model", "strict-judge"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rescored = orjson.loads((out / "results.json").read_bytes())
    assert rescored["run"]["judge_model"] == "strict-judge"
    assert rescored["arms"]["improved"]["accuracy"]["improved"]["judge"]["all"]["mean"] == 0.0
    prompts = [r.json()["messages"][-1]["content"] for r in upstream.requests]
    assert prompts and all(p.startswith("You grade an answer") for p in prompts)


def test_the_demo_replays_the_bundled_trajectories_through_every_arm(tmp_path: Path) -> None:
    done = replay("demo", "--out", str(tmp_path / "demo"))
    assert done.returncode == 0, done.stdout + done.stderr
    results = orjson.loads((tmp_path / "demo" / "results.json").read_bytes())
    assert results["cases"]["used"] == 5 and len(results["arms"]) == 10
    assert results["run"]["context_window"] == 16_000
    assert all(arm["protocol_violations"] == 0 for arm in results["arms"].values())
    assert "improved_offload" in done.stdout


def test_shadow_mode_measures_what_a_shadow_deployment_records(tmp_path: Path) -> None:
    out = tmp_path / "shadow"
    done = replay(
        "run", "--input", str(SAMPLE), "--out", str(out), "--arms", "full,improved",
        "--context-window", "8000", "--mode", "shadow", "--limit", "3",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    results = orjson.loads((out / "results.json").read_bytes())
    improved = results["arms"]["improved"]
    assert results["run"]["mode"] == "shadow"
    # The upstream got the original history; the proxy's headers still report the view.
    assert improved["reduction"] > 0.2 and improved["compaction_events"] > 0
    # Views are only seen at question points (captured in enforce mode): no prefix figure.
    assert improved["prefix_stability"] is None
    assert sum(improved["survival_all"].values()) == sum(results["arms"]["full"]["survival_all"].values()) > 0


BILLED = (1_000, 100)  # what each call of the fake summarizer bills


def billed_summary(_: Recorded) -> Reply:
    body = completion("The agent ran the scripted checks one by one; each printed its log.", model="small")
    body["usage"] = {"prompt_tokens": BILLED[0], "completion_tokens": BILLED[1], "total_tokens": sum(BILLED)}
    return Reply(body=body)


def test_the_summarizer_tokens_are_every_call_the_summarizer_billed(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    """With a model summarizer preparing ahead, the replay's summarizer tokens are what the
    summarizer billed in all: a preparation that finishes after a session's last step (or one
    a question started) is read too, because the replay reads the events once the proxy has
    settled the session's preparations (``x-compaction-prepared: wait``)."""
    upstream.queue(*[Reply(dynamic=billed_summary) for _ in range(2000)])
    config = tmp_path / "replay.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "arms": ["improved"],
                "context_window": 8000,
                "summarizer_model": {"base_url": upstream.base_url, "model": "small", "timeout": 60},
            }
        )
    )
    out = tmp_path / "run"
    demo = ROOT / "replay" / "data" / "demo.jsonl"
    done = replay("run", "--input", str(demo), "--out", str(out), "--replay-config", str(config))
    assert done.returncode == 0, done.stdout + done.stderr
    improved = orjson.loads((out / "results.json").read_bytes())["arms"]["improved"]
    calls = len(upstream.requests)
    assert calls > improved["summarizer_model_calls"]  # preparations, used or not, beyond the points'
    assert (improved["summarizer_input_tokens"], improved["summarizer_output_tokens"]) == (
        calls * BILLED[0],
        calls * BILLED[1],
    )
