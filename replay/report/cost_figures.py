"""An arm's cost figures (``results.json`` ``arms.*.cost``) and their place in the reports.

The cache simulation and the tallies are ``replay.session.cost``; here the run's config picks the rule
and the rates, each arm's case sessions are billed, and the figures are compared with the full
arm's and, with model arms, divided by the correct answers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from replay.config import ReplayConfig
from replay.run.parts import CasePart
from replay.session.cost import MIN_CACHED_TOKENS, OPENAI_INCREMENT, Rates, RequestShape, Tallies


@dataclass(frozen=True, slots=True)
class CostModel:
    """The rule, horizon and rates a run's costs are computed with."""

    rule: str
    horizon: int
    client_breakpoint: bool
    rates: Rates
    prices_from: str  # the `prices` entry the rates come from
    ttl_seconds: float = 300.0

    def describe(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "horizon_requests": self.horizon,
            "ttl_seconds": self.ttl_seconds,
            "client_breakpoint": self.client_breakpoint if self.rule == "anthropic" else None,
            "prices_from": self.prices_from,
            "rates": {name: getattr(self.rates, name) for name in Rates.__slots__},
            "min_cached_tokens": MIN_CACHED_TOKENS,
            "increment": OPENAI_INCREMENT if self.rule == "openai" else None,
        }


def cost_model(config: ReplayConfig) -> CostModel:
    # "auto": the cache rule of the provider the door's requests go to (Anthropic's explicit
    # breakpoints; every other provider's cache, Gemini's implicit one too, is automatic prefix
    # caching: OpenAI's rule).
    rule, source, prices = config.run_prices()
    rates = Rates(
        cached_input=prices.cached_input,
        cache_write=prices.cache_write,
        output=prices.output,
        summarizer_input=config.prices.summarizer_input,
        summarizer_output=config.prices.summarizer_output,
    )
    return CostModel(
        rule, config.cache.horizon, config.cache.client_breakpoint, rates, source, config.cache.ttl_seconds
    )


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def arm_cost(
    sessions: Iterable[Sequence[RequestShape]],
    model: CostModel,
    *,
    cases: int,
    summarizer_input: int = 0,
    summarizer_output: int = 0,
) -> dict[str, Any]:
    """An arm's cost over its case sessions: prompt tokens read from the cache or not (steps and
    their read rounds), the summarizer's tokens (the compaction's own cost: its points' and its
    preparations', used or not), and the effective cost in full-price input tokens, the
    prompt's and the compaction's own apart too; answering (model arms) apart, for the cost per
    successful answer."""
    tallies = Tallies()
    for shapes in sessions:
        tallies.add_session(shapes, model.rule, model.horizon, model.client_breakpoint, model.ttl_seconds)
    rates, trajectory, reads = model.rates, tallies.trajectory, tallies.read_rounds
    prompt = trajectory.effective(rates)
    # The compaction's own cost, at the summarizer model's prices.
    own = summarizer_input * rates.summarizer_input + summarizer_output * rates.summarizer_output
    effective = prompt + own
    figures: dict[str, Any] = {
        "requests": trajectory.requests,
        "prompt_tokens": trajectory.prompt,
        "cached_tokens": trajectory.cached,
        "uncached_tokens": trajectory.prompt - trajectory.cached,
        "cache_write_tokens": trajectory.written,
        "cache_hit_share": _share(trajectory.cached, trajectory.prompt),
        "summarizer_tokens": {"input": summarizer_input, "output": summarizer_output},
        "read_round_tokens": {
            "requests": reads.requests,
            "input": reads.prompt,
            "cached": reads.cached,
            "output": reads.output,
        },
        "prompt_effective_tokens": round(prompt, 1),
        "prompt_effective_tokens_mean": round(prompt / cases, 1) if cases else 0.0,
        "compaction_effective_tokens": round(own, 1),
        "compaction_effective_tokens_mean": round(own / cases, 1) if cases else 0.0,
        "effective_input_tokens": round(effective, 1),
        "effective_input_tokens_mean": round(effective / cases, 1) if cases else 0.0,
        "effective_vs_full": None,
        "saved_vs_full_mean": None,
    }
    answering = tallies.answering
    if answering.requests:
        figures["answering"] = {
            "requests": answering.requests,
            "prompt_tokens": answering.prompt,
            "cached_tokens": answering.cached,
            "output_tokens": answering.output,
            "effective_input_tokens": round(answering.effective(rates), 1),
        }
    return figures


def compare_to_full(arms: dict[str, dict[str, Any]]) -> None:
    """Set each arm's ``cost.effective_vs_full`` (its effective cost over the full arm's) and
    ``cost.saved_vs_full_mean`` (the full arm's mean effective cost per case less its own:
    net of the compaction's own cost, which its effective cost holds)."""
    full = (arms.get("full") or {}).get("cost") or {}
    reference = full.get("effective_input_tokens")
    reference_mean = full.get("effective_input_tokens_mean")
    for figures in arms.values():
        cost = figures.get("cost")
        if cost is not None:
            cost["effective_vs_full"] = (
                round(cost["effective_input_tokens"] / reference, 4) if reference else None
            )
            cost["saved_vs_full_mean"] = (
                round(reference_mean - cost["effective_input_tokens_mean"], 1)
                if reference_mean is not None
                else None
            )


def per_successful_answer(
    cost: dict[str, Any] | None, questions: Iterable[dict[str, Any]]
) -> dict[str, Any] | None:
    """Model arms: what one correct answer costs, the trajectory included once per answering
    run (a run is an arm label and repeat): (runs x trajectory + answering) / correct answers.
    An answer is correct by the judge's verdict where there is one, else by the exact check;
    None until answers are graded."""
    if not cost or "answering" not in cost:
        return None
    runs: set[tuple[str, int]] = set()
    correct = graded = 0
    for question in questions:
        for answer in question.get("answers") or []:
            runs.add((str(answer.get("arm_label")), int(answer.get("repeat", 0))))
            verdict = (answer.get("judge") or {}).get("correct")
            if not isinstance(verdict, bool):
                verdict = (answer.get("exact") or {}).get("correct")
            if isinstance(verdict, bool):
                graded += 1
                correct += verdict
    if not graded:
        return None
    total = len(runs) * cost["effective_input_tokens"] + cost["answering"]["effective_input_tokens"]
    return {
        "runs": len(runs),
        "graded": graded,
        "correct": correct,
        "effective_input_tokens": round(total / correct, 1) if correct else None,
    }


def request_shapes(parts: Sequence[CasePart]) -> list[list[RequestShape]] | None:
    """Each part's requests as the recorded upstream logged them (``CasePart.requests``);
    None when a part that sent steps holds none (saved before they were kept)."""
    sessions = []
    for part in parts:
        saved = getattr(part, "requests", None)
        if not saved and part.tokens_before:
            return None
        sessions.append([RequestShape.from_json(r) for r in saved or []])
    return sessions


def cost_figures(model: CostModel | None, parts: Sequence[CasePart]) -> dict[str, Any] | None:
    """An arm's ``cost``: None in shadow mode (``model`` None) or when a part has no shapes."""
    sessions = request_shapes(parts) if model is not None else None
    if model is None or sessions is None:
        return None
    cost = arm_cost(
        sessions,
        model,
        cases=len(parts),
        summarizer_input=sum(p.summarizer_input_tokens for p in parts),
        summarizer_output=sum(p.summarizer_output_tokens for p in parts),
    )
    return cost


def refresh_per_successful_answer(results: dict[str, Any]) -> None:
    """Once answers are graded (after ``build_results``): each model arm's
    ``cost.per_successful_answer``."""
    for name, figures in results["arms"].items():
        cost = figures.get("cost")
        if cost and "answering" in cost:
            questions = [q for q in results["questions"] if q.get("arm") == name]
            figure = per_successful_answer(cost, questions)
            if figure is not None:
                cost["per_successful_answer"] = figure


def cost_run_note(model: CostModel | None, arms: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """How costs were computed, or why an arm has none."""
    if model is None:
        return {"missing": "shadow mode: the arms' views were not sent to the upstream"}
    note = model.describe()
    missing = [arm for arm, figures in arms.items() if figures.get("cost") is None]
    if missing:
        note["missing"] = (
            f"no request shapes saved in the parts of {', '.join(missing)} "
            "(parts saved by a harness that did not keep them)"
        )
    return note
