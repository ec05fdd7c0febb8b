"""The state-contract part of the reports: survival of injected (or natural) user facts by the
number of compaction cycles that passed over them, corrections shown stale, and one failing
example per kind with the part of the view where the fact should have been."""

from __future__ import annotations

import html
from typing import Any

from replay.questions.drift import CYCLE_BUCKETS


def drift_rows(results: dict[str, Any]) -> list[list[str]]:
    """arm x kind, one cell per cycle bucket: survived / asked."""
    rows = [["arm", "kind", *[f"{bucket} cycles" for bucket in CYCLE_BUCKETS], "stale shown"]]
    for arm, figures in results["arms"].items():
        for kind, buckets in sorted((figures.get("drift") or {}).items()):
            cells = []
            for bucket in CYCLE_BUCKETS:
                counts = buckets.get(bucket) or {}
                asked = sum(counts.values())
                kept = counts.get("visible", 0) + counts.get("recoverable", 0)
                cells.append(f"{kept}/{asked}" if asked else "-")
            rows.append([arm, kind, *cells, str(figures.get("stale_presented", 0))])
    return rows if len(rows) > 1 else []


DRIFT_NOTE = (
    "State-contract facts (constraints, corrections, deferred instructions, approvals, decisions "
    "stated by the user) survived / asked, by the number of compaction cycles whose covered range "
    "held the message that states them. Arms that only cut (n_latest) record no covered range: "
    "their losses all show at 0 cycles. 'stale shown': a corrected-away value in the final view "
    "with no correction after it (absent, or only earlier: a wrong statement kept after a "
    "summary whose ledger holds the correction)."
)


def failing_example_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    examples = []
    for arm, figures in results["arms"].items():
        for kind, example in sorted((figures.get("failing_examples") or {}).items()):
            examples.append({**example, "arm": example.get("arm") or arm, "kind": kind})
    return examples


def failing_examples_html(results: dict[str, Any]) -> str:
    parts = []
    for example in failing_example_rows(results):
        fact = "; ".join(str(f) for f in example.get("fact") or [])
        snippet = html.escape(example.get("snippet") or "")
        parts.append(
            f"<h3>{html.escape(example['arm'])}: {html.escape(example['kind'])} "
            f"({html.escape(str(example.get('case_id') or ''))}, {example.get('cycles')} cycles"
            f"{', stale value shown' if example.get('stale_presented') else ''})</h3>"
            f"<p>lost: <code>{html.escape(fact)}</code></p>"
            f'<pre style="white-space:pre-wrap;text-align:left">{snippet}</pre>'
        )
    return "\n".join(parts)
