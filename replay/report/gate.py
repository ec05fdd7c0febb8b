"""The release gate: thresholds declared in the replay config, checked after the run.

A gated arm fails when any figure crosses its threshold; the verdict names the failing
figures, and ``replay run`` exits non-zero so a CI pipeline can gate a policy change.
"""

from __future__ import annotations

from typing import Any

from replay.config import Gate
from replay.report.results import survival_share


def _accuracy(figures: dict[str, Any], label: str) -> float | None:
    accuracy = (figures.get("accuracy") or {}).get(label) or {}
    for source in ("judge", "exact"):
        table = accuracy.get(source) or {}
        if "all" in table:
            return float(table["all"]["mean"])
    return None


def evaluate_gate(gate: Gate, arms: dict[str, dict[str, Any]]) -> dict[str, Any]:
    gated = list(gate.arms) or [arm for arm in arms if arm != "full"]
    full = arms.get("full")
    verdicts: dict[str, Any] = {}
    for arm in gated:
        figures = arms.get(arm)
        failures: list[str] = []
        if figures is None:
            verdicts[arm] = {"passed": False, "failures": ["arm was not run"]}
            continue
        cases = max(1, int(figures.get("cases", 0)))
        if figures["protocol_violations"] > gate.max_protocol_violations:
            failures.append(
                f"protocol violations {figures['protocol_violations']} > {gate.max_protocol_violations}"
            )
        if figures.get("errors"):
            failures.append(f"{figures['errors']} requests failed")
        if full is None:
            failures.append("the full arm was not run: survival and accuracy drops cannot be checked")
        else:
            for kind, counts in figures["survival"].items():
                mine, reference = survival_share(counts), survival_share(full["survival"].get(kind, {}))
                if mine is None or reference is None:
                    continue
                margin = gate.max_survival_drop.get(kind, gate.max_survival_drop.get("default", 0.1))
                if reference - mine > margin + 1e-9:
                    failures.append(
                        f"survival of {kind} {mine:.1%} is {reference - mine:.1%} below full's "
                        f"{reference:.1%} (allowed {margin:.0%})"
                    )
            if gate.max_accuracy_drop is not None:
                mine_accuracy, full_accuracy = _accuracy(figures, arm), _accuracy(full, "full")
                if (
                    mine_accuracy is not None
                    and full_accuracy is not None
                    and full_accuracy - mine_accuracy > gate.max_accuracy_drop + 1e-9
                ):
                    failures.append(
                        f"accuracy {mine_accuracy:.1%} is {full_accuracy - mine_accuracy:.1%} below "
                        f"full's {full_accuracy:.1%} (allowed {gate.max_accuracy_drop:.0%})"
                    )
        if gate.min_reduction is not None and figures["reduction"] < gate.min_reduction:
            failures.append(f"reduction {figures['reduction']:.1%} < {gate.min_reduction:.0%}")
        if gate.max_summarizer_calls_per_case is not None:
            per_case = figures["summarizer_calls"] / cases
            if per_case > gate.max_summarizer_calls_per_case:
                failures.append(
                    f"summarizer calls per case {per_case:.2f} > {gate.max_summarizer_calls_per_case}"
                )
        if gate.max_retrieval_calls_per_case is not None and "retrieval_rounds" in figures:
            per_case = figures["retrieval_rounds"] / cases
            if per_case > gate.max_retrieval_calls_per_case:
                failures.append(
                    f"retrieval calls per case {per_case:.2f} > {gate.max_retrieval_calls_per_case}"
                )
        verdicts[arm] = {"passed": not failures, "failures": failures}
    return {
        "declared": {
            "arms": gated,
            "max_protocol_violations": gate.max_protocol_violations,
            "max_survival_drop": dict(gate.max_survival_drop),
            "min_reduction": gate.min_reduction,
            "max_summarizer_calls_per_case": gate.max_summarizer_calls_per_case,
            "max_retrieval_calls_per_case": gate.max_retrieval_calls_per_case,
            "max_accuracy_drop": gate.max_accuracy_drop,
        },
        "verdicts": verdicts,
        "passed": all(v["passed"] for v in verdicts.values()),
    }
