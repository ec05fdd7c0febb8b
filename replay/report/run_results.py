"""``results.json`` of a run: the figures built from a run's raw parts (or a merge of runs),
and, with an answer model, every stored answer graded (exact checks, and the judge's verdict
when a judge is set)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from replay.config import ModelEndpoint, ReplayConfig
from replay.report.cost_figures import refresh_per_successful_answer
from replay.report.results import accuracy_of, build_results
from replay.session.answers import exact_check, judge_answer


def results_of_run(config: ReplayConfig, raw: dict[str, Any], input_path: Path) -> dict[str, Any]:
    """``results.json`` of a run (``run_replay``'s raw parts) or of a merge of runs."""
    results = build_results(
        config,
        raw["loaded"],
        raw["parts"],
        policy_specs=raw["policy_specs"],
        seconds=raw["seconds"],
        input_path=input_path,
        proxy=raw["proxy_url"],
    )
    # Requests the recorded upstream could not match to a replay step (a proxy rewriting
    # what it should relay would show here).
    results["run"]["unexpected_upstream_requests"] = raw["unexpected_upstream_requests"]
    if config.answer_model is not None:
        asyncio.run(grade(results, config.judge_model))
    return results


async def grade(results: dict[str, Any], judge: ModelEndpoint | None) -> None:
    """Exact checks on every stored answer, and the judge's verdict when a judge is set."""
    semaphore = asyncio.Semaphore(4)
    async with httpx.AsyncClient(trust_env=False) as http:

        async def one(question: dict[str, Any], answer: dict[str, Any]) -> None:
            answer["exact"] = exact_check(
                question.get("exact_items") or question["evidence"], answer["answer"]
            )
            if judge is not None:
                async with semaphore:
                    answer["judge"] = await judge_answer(http, judge, question, answer["answer"])

        await asyncio.gather(*(one(q, a) for q in results["questions"] for a in q.get("answers") or []))
    for arm, figures in results["arms"].items():
        entries = [q for q in results["questions"] if q["arm"] == arm]
        labels = [arm, "full_repeat"] if arm == "full" else [arm]
        accuracy = {label: acc for label in labels if (acc := accuracy_of(entries, label)) is not None}
        if accuracy:
            figures["accuracy"] = accuracy
    results["run"]["judge_model"] = judge.model if judge is not None else None
    refresh_per_successful_answer(results)
