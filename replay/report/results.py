"""``results.json``: the per-arm figures, the cases, and every question's outcome.

Schema (version 1; every count is an integer):

- ``schema_version``, ``run``: the replay config, the input file's SHA-256, the proxy policy
  specs of the arms (and their hash), package versions, the git commit where known, the
  context window, the mode, the summarizer (``ledger`` offline, else the model), seconds.
- ``arms``: ``{NAME: {requests, protocol_violations, errors, tokens_before_mean,
  tokens_after_mean, tokens_before_p95, tokens_after_p95, tokens_before_peak,
  tokens_after_peak, reduction, compaction_events, summarizer_calls, summarizer_model_calls,
  summarizer_input_tokens, summarizer_output_tokens (the compaction's own: its points' and its
  preparations', from the events' ``compaction_cost``), summarizer, prefix_stability,
  survival: {KIND: {visible, recoverable, lost}}, survival_all, accuracy}}``.
  ``reduction`` is 1 - sum(after) / sum(before) over all step requests. ``prefix_stability``
  is the share of consecutive requests, with no compaction point between them, whose view
  keeps the previous view unchanged up to its tail (its newest step with output, which a tight
  session's ``tail_offload`` may put behind a handle) and extends it (what a provider's prompt
  cache needs: everything before the tail is served from it; null when no pair qualifies).
  ``accuracy`` is present with model arms: per repeat and kind, mean and range, for the
  deterministic check and the judge.
  ``cost`` (``replay.report.cost_figures``; null in shadow mode, or when a part holds no request
  shapes): ``{requests, prompt_tokens, cached_tokens, uncached_tokens, cache_write_tokens,
  cache_hit_share, summarizer_tokens: {input, output}, read_round_tokens: {requests, input,
  cached, output}, prompt_effective_tokens(_mean), compaction_effective_tokens(_mean),
  effective_input_tokens, effective_input_tokens_mean, effective_vs_full, saved_vs_full_mean}``
  over the steps (and their read rounds) of every case, prompt caching simulated per case
  session; effective figures are in full-price input tokens (the prompt's plus the
  compaction's own: ``summarizer_tokens`` at the summarizer's rates), ``_mean`` per case,
  ``_vs_full`` the ratio to the full arm's, ``saved_vs_full_mean`` the full arm's mean less
  this arm's (net of the compaction's own cost). With model arms also ``answering: {requests, prompt_tokens,
  cached_tokens, output_tokens, effective_input_tokens}`` and, once graded
  (``refresh_per_successful_answer``), ``per_successful_answer: {runs, graded, correct,
  effective_input_tokens}``. ``run.cost`` names the rule, horizon and rates, or what is missing.
- ``cases``: ``{used, rejected: {REASON: count}, rejected_rows, questions_omitted:
  {KIND: {REASON: count}}}``.
- ``questions``: one entry per question and arm: ``question_id, case_id, kind, arm, prompt,
  reference, evidence, survival, missing, tokens_in_view`` and with model arms ``answers``
  (answer, cost, ``exact`` check, ``judge`` verdict with its reasons).
- ``series``: per arm and case, the tokens after each request (the sawtooth).
- ``gate``: the declared thresholds and the verdict per gated arm.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson

from replay.config import ReplayConfig
from replay.questions import STATE_KINDS, Question
from replay.questions.drift import drift_table, failing_examples
from replay.report.cost_figures import CostModel, compare_to_full, cost_figures, cost_model, cost_run_note
from replay.run.record import run_record
from replay.run.run import CasePart, Loaded
from replay.session.survival import SURVIVAL_STATES, merge_counts

SCHEMA_VERSION = 1


def _percentile(values: Sequence[int], share: float) -> int:
    if not values:
        return 0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(share * (len(ordered) - 1))))
    return ordered[index]


def _mean(values: Sequence[float]) -> float:
    return round(sum(values) / len(values), 1) if values else 0.0


def accuracy_of(entries: Iterable[dict[str, Any]], label: str) -> dict[str, Any] | None:
    """Mean and range over repeats of the share of correct answers, overall and per kind."""
    per_repeat: dict[int, dict[str, list[bool]]] = {}
    judged: dict[int, dict[str, list[bool]]] = {}
    for entry in entries:
        for answer in entry.get("answers") or []:
            if answer.get("arm_label") != label:
                continue
            repeat = int(answer.get("repeat", 0))
            exact = answer.get("exact") or {}
            if "correct" in exact:
                per_repeat.setdefault(repeat, {}).setdefault(entry["kind"], []).append(bool(exact["correct"]))
            verdict = (answer.get("judge") or {}).get("correct")
            if isinstance(verdict, bool):
                judged.setdefault(repeat, {}).setdefault(entry["kind"], []).append(verdict)
    if not per_repeat and not judged:
        return None

    def summarize(table: dict[int, dict[str, list[bool]]]) -> dict[str, Any]:
        kinds = sorted({k for by_kind in table.values() for k in by_kind})
        result: dict[str, Any] = {}
        for scope in ["all", *kinds]:
            shares = []
            for by_kind in table.values():
                values = [v for k, vs in by_kind.items() if scope in ("all", k) for v in vs]
                if values:
                    shares.append(sum(values) / len(values))
            if shares:
                result[scope] = {
                    "mean": round(statistics.fmean(shares), 3),
                    "min": round(min(shares), 3),
                    "max": round(max(shares), 3),
                    "repeats": len(shares),
                }
        return result

    return {"exact": summarize(per_repeat), "judge": summarize(judged) if judged else None}


def arm_figures(
    arm: str,
    parts: Sequence[CasePart],
    questions: Sequence[dict[str, Any]],
    cost: CostModel | None = None,
) -> dict[str, Any]:
    before = [t for p in parts for t in p.tokens_before]
    after = [t for p in parts for t in p.tokens_after]
    stable = [s for p in parts for s in p.stable if s is not None]
    kinds = sorted({q["kind"] for q in questions})
    survival = {
        kind: merge_counts([{q["survival"]: 1} for q in questions if q["kind"] == kind and q.get("survival")])
        for kind in kinds
    }
    summary_kinds = {k for p in parts for k in p.summary_kinds}
    figures: dict[str, Any] = {
        "requests": len(before),
        "protocol_violations": sum(len(p.problems) for p in parts),
        "errors": sum(len(p.errors) for p in parts),
        "tokens_before_mean": _mean(before),
        "tokens_after_mean": _mean(after),
        "tokens_before_p95": _percentile(before, 0.95),
        "tokens_after_p95": _percentile(after, 0.95),
        "tokens_before_peak": max(before, default=0),
        "tokens_after_peak": max(after, default=0),
        "reduction": round(1 - sum(after) / sum(before), 4) if sum(before) else 0.0,
        "compaction_events": sum(p.compaction_events for p in parts),
        "summarizer_calls": sum(p.summaries for p in parts),
        "summarizer_model_calls": sum(p.summarizer_model_calls for p in parts),
        "summarizer_input_tokens": sum(p.summarizer_input_tokens for p in parts),
        "summarizer_output_tokens": sum(p.summarizer_output_tokens for p in parts),
        "summarizer": (
            "none"
            if not summary_kinds
            else "ledger (offline, model-free)"
            if summary_kinds == {"ledger"}
            else "model: " + ", ".join(sorted(summary_kinds - {"ledger"}))
        ),
        "prefix_stability": round(sum(stable) / len(stable), 4) if stable else None,
        "survival": survival,
        "survival_all": merge_counts(survival.values()),
        "reads": {kind: read_figures([q for q in questions if q["kind"] == kind]) for kind in kinds},
        "cases": len(parts),
        "seconds": round(sum(p.seconds for p in parts), 1),
        "cost": cost_figures(cost, parts),
    }
    state = [q for q in questions if q["kind"] in STATE_KINDS]
    if state:
        # Multi-cycle drift: survival of the state-contract facts by the number of compaction
        # cycles that passed over them, corrections shown stale, one failing example per kind.
        figures["drift"] = drift_table(state)
        figures["stale_presented"] = sum(1 for q in state if q.get("stale_presented"))
        figures["failing_examples"] = failing_examples(state)
    labels = [arm, "full_repeat"] if arm == "full" else [arm]
    for label in labels:
        accuracy = accuracy_of(questions, label)
        if accuracy is not None:
            figures.setdefault("accuracy", {})[label] = accuracy
    retrieval = [a.get("retrieval_rounds", 0) for q in questions for a in q.get("answers") or []]
    if retrieval:
        figures["retrieval_rounds"] = int(sum(retrieval))
        figures["answer_prompt_tokens"] = int(
            sum(a.get("prompt_tokens", 0) for q in questions for a in q.get("answers") or [])
        )
    return figures


def question_entries(
    loaded: Loaded, parts: dict[tuple[str, str], CasePart], arms: Sequence[str]
) -> list[dict[str, Any]]:
    by_id: dict[str, Question] = {q.question_id: q for qs in loaded.questions.values() for q in qs}
    entries = []
    for arm in arms:
        for case in loaded.cases:
            part = parts.get((arm, case.case_id))
            if part is None:
                continue
            for outcome in part.questions:
                question = by_id.get(outcome["question_id"])
                if question is None:
                    continue
                entries.append(
                    {
                        "question_id": question.question_id,
                        "case_id": case.case_id,
                        "kind": question.kind,
                        "arm": arm,
                        "prompt": question.prompt,
                        "reference": question.reference,
                        "evidence": list(question.evidence),
                        "exact_items": list(question.exact_items),
                        **{k: v for k, v in outcome.items() if k not in ("question_id", "kind")},
                    }
                )
    return entries


def build_results(
    config: ReplayConfig,
    loaded: Loaded,
    parts: dict[tuple[str, str], CasePart],
    *,
    policy_specs: dict[str, Any],
    seconds: float,
    input_path: Path,
    proxy: str,
) -> dict[str, Any]:
    """The whole ``results.json`` (see the module's docstring for its schema)."""
    questions = question_entries(loaded, parts, config.arms)
    model = cost_model(config) if config.mode == "enforce" else None
    arms = _all_arm_figures(config, loaded, parts, questions, model)
    return {
        "schema_version": SCHEMA_VERSION,
        "run": run_record(
            config,
            loaded,
            policy_specs,
            cost_note=cost_run_note(model, arms),
            seconds=seconds,
            input_path=input_path,
            proxy=proxy,
        ),
        "arms": arms,
        "cases": _cases_record(config, loaded),
        "questions": questions,
        "series": _series_after(config, loaded, parts),
        "series_before": _series_before(config, loaded, parts),
    }


def _all_arm_figures(
    config: ReplayConfig,
    loaded: Loaded,
    parts: dict[tuple[str, str], CasePart],
    questions: Sequence[dict[str, Any]],
    model: CostModel | None,
) -> dict[str, dict[str, Any]]:
    """Every arm's figures over its cases (in the input's order), each arm's cost also compared
    with the full arm's."""
    arms = {}
    for arm in config.arms:
        arm_parts = [parts[(arm, c.case_id)] for c in loaded.cases if (arm, c.case_id) in parts]
        arms[arm] = arm_figures(arm, arm_parts, [q for q in questions if q["arm"] == arm], model)
    compare_to_full(arms)
    return arms


def _cases_record(config: ReplayConfig, loaded: Loaded) -> dict[str, Any]:
    """The cases used, the rows rejected (counted by reason, and each one), the questions asked
    per kind and those omitted."""
    rejected: dict[str, int] = {}
    for item in loaded.rejected:
        rejected[item.reason] = rejected.get(item.reason, 0) + 1
    return {
        "used": len(loaded.cases),
        "rejected": rejected,
        "rejected_rows": [
            {"row": r.row_number, "instance_id": r.instance_id, "reason": r.reason, "detail": r.detail}
            for r in loaded.rejected
        ],
        "questions": {
            kind: sum(1 for qs in loaded.questions.values() for q in qs if q.kind == kind)
            for kind in config.kinds
        },
        "questions_omitted": loaded.omitted,
    }


def _series_after(
    config: ReplayConfig, loaded: Loaded, parts: dict[tuple[str, str], CasePart]
) -> dict[str, dict[str, list[int]]]:
    """Per arm and case, the tokens after each request (the sawtooth)."""
    return {
        arm: {
            case.case_id: parts[(arm, case.case_id)].tokens_after
            for case in loaded.cases
            if (arm, case.case_id) in parts
        }
        for arm in config.arms
    }


def _series_before(
    config: ReplayConfig, loaded: Loaded, parts: dict[tuple[str, str], CasePart]
) -> dict[str, list[int]]:
    """Per case, the tokens of each request as the client sent it, from the first arm (in the
    config's order) that ran the case; none when no arm did."""
    return {
        case.case_id: next(
            (parts[(arm, case.case_id)].tokens_before for arm in config.arms if (arm, case.case_id) in parts),
            [],
        )
        for case in loaded.cases
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    temporary.replace(path)


def read_figures(questions: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Stored vs read back for one kind: questions whose evidence the store holds (visible, or
    under a handle the view names, a few hops deep), those the scripted reader got back through
    the proxy, and what the reads cost (calls and rounds per question that read, reads the
    proxy answered with "no room")."""
    reading = [q for q in questions if q.get("survival") in ("recoverable", "lost") and q.get("read_calls")]
    return {
        "questions": len(questions),
        "stored": sum(1 for q in questions if q.get("stored") or q.get("survival") == "visible"),
        "read_back": sum(1 for q in questions if q.get("survival") in ("visible", "recoverable")),
        "read_calls_per_question": round(_mean([q["read_calls"] for q in reading]), 2) if reading else 0,
        "read_rounds_per_question": round(_mean([q.get("read_rounds", 0) for q in reading]), 2)
        if reading
        else 0,
        "no_room_reads": sum(int(q.get("no_room_reads") or 0) for q in questions),
    }


def survival_share(counts: dict[str, int]) -> float | None:
    """Share of questions whose evidence is visible or recoverable."""
    total = sum(counts.get(s, 0) for s in SURVIVAL_STATES)
    return (counts.get("visible", 0) + counts.get("recoverable", 0)) / total if total else None


KIND_LABELS = {
    "files_changed": "files changed",
    "first_edit": "first edit",
    "command_output": "command output",
    "error": "error",
    "constraint": "constraint",
    "correction": "correction",
    "deferred_instruction": "deferred instruction",
    "approval": "approval",
    "decision": "decision",
}


def kinds_in(results: dict[str, Any]) -> list[str]:
    """The question kinds the run asked that some arm has survival figures for, in run order."""
    kinds: list[str] = list(results["run"]["config"]["kinds"])
    present = {k for arm in results["arms"].values() for k in arm["survival"]}
    return [k for k in kinds if k in present]
