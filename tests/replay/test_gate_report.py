"""The release gate's verdicts, and the reports built from results."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from replay.cli import _finish
from replay.config import Gate, ReplayConfigError, load_replay_config
from replay.report.gate import evaluate_gate
from replay.report.report import console_table, report_html, summary_markdown


def arm(reduction: float, lost: int, violations: int = 0, summaries: int = 0) -> dict[str, Any]:
    return {
        "requests": 10,
        "protocol_violations": violations,
        "errors": 0,
        "tokens_before_mean": 1000.0,
        "tokens_after_mean": 1000.0 * (1 - reduction),
        "tokens_before_p95": 1500,
        "tokens_after_p95": 1200,
        "tokens_before_peak": 1600,
        "tokens_after_peak": 1300,
        "reduction": reduction,
        "compaction_events": 2,
        "summarizer_calls": summaries,
        "summarizer_model_calls": 0,
        "summarizer_input_tokens": 0,
        "summarizer_output_tokens": 0,
        "summarizer": "ledger (offline, model-free)",
        "prefix_stability": 1.0,
        "survival": {"error": {"visible": 10 - lost, "recoverable": 0, "lost": lost}},
        "survival_all": {"visible": 10 - lost, "recoverable": 0, "lost": lost},
        "cases": 2,
        "seconds": 1.0,
    }


def results(**arms: dict[str, Any]) -> dict[str, Any]:
    return {
        "run": {
            "config": {"kinds": ["files_changed", "first_edit", "command_output", "error"]},
            "context_window": 16000,
            "mode": "enforce",
            "summarizer": "ledger (offline, model-free)",
            "seconds": 1.0,
            "answer_model": None,
            "judge_model": None,
        },
        "arms": arms,
        "cases": {"used": 2, "rejected": {"unmatched tool call": 1}, "questions": {"error": 10}},
        "questions": [
            {"arm": "cut", "question_id": "c:error", "survival": "lost", "missing": ["ValueError: x"]}
        ],
        "series": {"full": {"c": [100, 200, 300]}, "cut": {"c": [100, 150, 90]}},
        "series_before": {"c": [100, 200, 300]},
    }


def test_gate_passes_within_thresholds() -> None:
    verdict = evaluate_gate(Gate(min_reduction=0.2), {"full": arm(0.0, 0), "cut": arm(0.5, 1)})
    assert verdict["passed"]
    assert verdict["verdicts"] == {"cut": {"passed": True, "failures": []}}


def test_gate_names_every_failing_figure() -> None:
    gate = Gate(min_reduction=0.6, max_survival_drop={"default": 0.05}, max_summarizer_calls_per_case=1)
    verdict = evaluate_gate(gate, {"full": arm(0.0, 0), "cut": arm(0.5, 3, violations=1, summaries=4)})
    failures = verdict["verdicts"]["cut"]["failures"]
    assert not verdict["passed"]
    assert any("protocol violations 1" in f for f in failures)
    assert any("survival of error 70.0% is 30.0% below" in f for f in failures)
    assert any("reduction 50.0% < 60%" in f for f in failures)
    assert any("summarizer calls per case 2.00 > 1" in f for f in failures)


def test_gate_without_the_full_arm_cannot_pass() -> None:
    verdict = evaluate_gate(Gate(arms=("cut",)), {"cut": arm(0.5, 0)})
    assert not verdict["passed"]
    assert "full arm was not run" in verdict["verdicts"]["cut"]["failures"][0]


def test_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = load_replay_config(None, {"arms": ("full", "cut"), "gate": {"min_reduction": 0.9}})
    assert _finish(results(full=arm(0.0, 0), cut=arm(0.5, 0)), tmp_path / "a", None) == 0
    assert _finish(results(full=arm(0.0, 0), cut=arm(0.5, 0)), tmp_path / "b", config) == 3
    assert "cut: FAIL: reduction 50.0% < 90%" in capsys.readouterr().out
    assert _finish(results(full=arm(0.0, 0), cut=arm(0.5, 0, violations=2)), tmp_path / "c", None) == 1
    assert (tmp_path / "c" / "results.json").exists()


def test_summary_and_html(tmp_path: Path) -> None:
    data = results(full=arm(0.0, 0), cut=arm(0.5, 1))
    data["gate"] = evaluate_gate(Gate(min_reduction=0.9), data["arms"])
    summary = summary_markdown(data)
    assert "| cut | 10 | 1,000 | 500 / 1,200 / 1,300 | 50.0% |" in summary
    assert "## Release gate: FAILED" in summary
    assert "unmatched tool call: 1" in summary
    page = report_html(data)
    # Self-contained: no scripts, no external resources.
    assert "<script" not in page
    assert not re.search(r"(src|href)=['\"]?https?:", page)
    assert page.count("<svg") >= 4
    assert "ValueError: x" in page
    assert "cut" in console_table(data)


def test_replay_config_is_validated() -> None:
    with pytest.raises(ReplayConfigError, match="kinds"):
        load_replay_config(None, {"kinds": ("nonsense",)})
    with pytest.raises(ReplayConfigError):
        load_replay_config(None, {"arms": "full", "bogus": 1})


def test_the_example_replay_config_is_valid_and_its_defaults_are_the_built_ins(tmp_path: Path) -> None:
    from replay.config import ReplayConfig

    example = Path(__file__).resolve().parents[2] / "replay.example.yml"
    assert load_replay_config(example) == ReplayConfig()
    # The commented examples are valid too.
    uncommented = "\n".join(
        line.replace("# ", "", 1)
        if line.startswith(("# answer_model", "# judge_model", "# gate:", "#   "))
        else line
        for line in example.read_text().splitlines()
        if not line.startswith(("answer_model: null", "judge_model: null", "gate: null"))
    )
    path = tmp_path / "example.yml"
    path.write_text(uncommented)
    config = load_replay_config(path)
    assert config.gate is not None and config.gate.max_survival_drop["first_edit"] == 0.15
    assert config.answer_model is not None and config.answer_model.api_key_env == "OPENAI_API_KEY"
