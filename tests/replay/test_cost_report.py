"""An arm's cost from its parts, and the cost in ``summary.md`` and ``report.html``."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

from replay.config import load_replay_config
from replay.report.cost_figures import (
    compare_to_full,
    cost_figures,
    cost_model,
    cost_run_note,
    refresh_per_successful_answer,
)
from replay.report.report import console_table, report_html, summary_markdown
from tests.replay.test_cost import growing, shape
from tests.replay.test_gate_report import arm, results


def part(shapes: list[Any], **figures: Any) -> Any:
    """A part as ``CasePart`` will hold it, with its request shapes (``requests``)."""
    return SimpleNamespace(
        requests=[s.to_json() for s in shapes],
        tokens_before=[s.prompt for s in shapes if s.kind == "step"],
        summarizer_input_tokens=figures.get("summarizer_input", 0),
        summarizer_output_tokens=figures.get("summarizer_output", 0),
    )


def sliding(steps: int) -> list[Any]:
    """A view that keeps the head and the last 3 messages: from the 4th step on it slides."""
    return [
        shape([(0, 500), (1, 1500)] + [(10 + n, 300) for n in range(max(0, k - 3), k)]) for k in range(steps)
    ]


def test_an_arm_cost_from_its_parts_and_against_the_full_arm() -> None:
    model = cost_model(load_replay_config(None))
    arms = {
        "full": {"cost": cost_figures(model, [part(growing(8)), part(growing(4))])},
        "window": {"cost": cost_figures(model, [part(sliding(8)), part(sliding(4))])},
        "stable": {
            "cost": cost_figures(model, [part(growing(5), summarizer_input=400), part(growing(4))]),
        },
    }
    compare_to_full(arms)
    full, window, stable = (arms[name]["cost"] for name in ("full", "window", "stable"))
    # The compaction's own cost, at the summarizer's rates, apart from the prompt's and in the total.
    assert stable["compaction_effective_tokens"] == 400 * model.rates.summarizer_input
    assert (
        stable["effective_input_tokens"]
        == stable["prompt_effective_tokens"] + stable["compaction_effective_tokens"]
    )
    # Saved against the full arm is net of it.
    saved = full["effective_input_tokens_mean"] - stable["effective_input_tokens_mean"]
    assert stable["saved_vs_full_mean"] == round(saved, 1) and full["saved_vs_full_mean"] == 0.0
    assert full["requests"] == window["requests"] == 12 and stable["requests"] == 9
    # The sliding window sends fewer tokens than the full history, but only its head is cached.
    assert window["prompt_tokens"] < full["prompt_tokens"]
    assert window["cache_hit_share"] < stable["cache_hit_share"] < full["cache_hit_share"]
    assert stable["summarizer_tokens"] == {"input": 400, "output": 0}
    assert full["effective_vs_full"] == 1.0
    assert window["effective_vs_full"] == round(
        window["effective_input_tokens"] / full["effective_input_tokens"], 4
    )
    assert full["effective_input_tokens_mean"] == full["effective_input_tokens"] / 2
    note = cost_run_note(model, arms)
    assert note["rule"] == "openai" and note["horizon_requests"] == 16 and "missing" not in note
    assert note["rates"]["cached_input"] == 0.5


def test_no_cost_in_shadow_mode_or_without_request_shapes() -> None:
    model = cost_model(load_replay_config(None))
    old = SimpleNamespace(
        requests=[], tokens_before=[100], summarizer_input_tokens=0, summarizer_output_tokens=0
    )
    assert cost_figures(model, [part(growing(3)), old]) is None
    assert cost_figures(None, [part(growing(3))]) is None
    assert "parts of cut" in cost_run_note(model, {"full": {"cost": {}}, "cut": {"cost": None}})["missing"]
    assert cost_run_note(None, {})["missing"].startswith("shadow mode")


def test_the_cost_per_successful_answer_is_set_once_answers_are_graded() -> None:
    model = cost_model(load_replay_config(None))
    answer = shape([(0, 500), (1, 1500), (7, 200)], kind="answer", output=50)
    data: dict[str, Any] = {
        "arms": {"cut": {"cost": cost_figures(model, [part([*growing(3), answer])])}},
        "questions": [{"arm": "cut", "answers": [{"arm_label": "cut", "repeat": 0}]}],
    }
    refresh_per_successful_answer(data)
    assert "per_successful_answer" not in data["arms"]["cut"]["cost"]
    data["questions"][0]["answers"][0]["exact"] = {"correct": True}
    refresh_per_successful_answer(data)
    cost = data["arms"]["cut"]["cost"]
    expected = cost["effective_input_tokens"] + cost["answering"]["effective_input_tokens"]
    assert cost["per_successful_answer"]["effective_input_tokens"] == round(expected, 1)


def test_the_reports_show_cost_beside_reduction() -> None:
    model = cost_model(load_replay_config(None))
    full, cut = arm(0.0, 0), arm(0.5, 1)
    full["cost"] = cost_figures(model, [part(growing(6))])
    cut["cost"] = cost_figures(model, [part(sliding(6))])
    data = results(full=full, cut=cut)
    compare_to_full(data["arms"])
    data["run"]["cost"] = cost_run_note(model, data["arms"])
    summary = summary_markdown(data)
    header = next(line for line in summary.splitlines() if line.startswith("| arm |"))
    columns = (
        "| reduction | cache hit | prompt cost (mean/case) | compaction's own cost (mean/case) "
        "| effective cost (mean/case) | saved vs full, net (mean/case) | vs full |"
    )
    assert columns in header
    figures = cut["cost"]
    share = f"{figures['cache_hit_share']:.0%}"
    prompt, own = (
        f"{figures['prompt_effective_tokens_mean']:,.0f}",
        f"{figures['compaction_effective_tokens_mean']:,.0f}",
    )
    mean, saved = f"{figures['effective_input_tokens_mean']:,.0f}", f"{figures['saved_vs_full_mean']:,.0f}"
    cells = (
        f"| cut | 10 | 1,000 | 500 / 1,200 / 1,300 | 50.0% | {share} | {prompt} | {own} | {mean} | {saved} | "
    )
    assert cells in summary
    assert "Cost: prompt caching simulated with the OpenAI rule" in summary
    assert "cached x 0.5" in summary
    page = report_html(data)
    assert "<script" not in page and "effective cost (mean/case)" in page
    assert "Cost: prompt caching simulated" in page
    assert "cache hit" in console_table(data)
    # Results without costs (older results.json, shadow mode) still render.
    data["arms"]["cut"]["cost"] = None
    data["run"]["cost"] = cost_run_note(None, {})
    assert re.search(r"\| cut \| .* \| 50\.0% \| n/a \| n/a \| n/a \|", summary_markdown(data))
    assert "Cost: n/a (shadow mode" in summary_markdown(data)
