"""``summary.md`` (the table a reader wants first) and a self-contained ``report.html``.

The HTML has no scripts and no external resources: charts are inline SVG, so the file can be
attached to a pull request or an issue and opened anywhere.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from replay.report.charts import cost_survival_scatter, line_chart, survival_bars
from replay.report.cost import COST_HEADER, cost_cells, cost_note, per_success_table
from replay.report.drift import DRIFT_NOTE, drift_rows, failing_examples_html
from replay.report.reads import READS_NOTE, reads_table
from replay.report.results import KIND_LABELS, kinds_in


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def _survival_cell(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    if not total:
        return "-"
    visible, recoverable = counts.get("visible", 0), counts.get("recoverable", 0)
    text = f"{visible + recoverable}/{total}"
    return text + (f" ({recoverable} via handle)" if recoverable else "")


def main_table(results: dict[str, Any]) -> list[list[str]]:
    kinds = kinds_in(results)
    header = [
        "arm",
        "requests",
        "tokens before (mean)",
        "tokens after (mean / p95 / peak)",
        "reduction",
        *COST_HEADER,
        "compactions",
        "summaries",
        "prefix stable",
        *[f"{KIND_LABELS.get(k, k)} survived" for k in kinds],
        "violations",
    ]
    rows = [header]
    for name, arm in results["arms"].items():
        rows.append(
            [
                name,
                str(arm["requests"]),
                f"{arm['tokens_before_mean']:,.0f}",
                f"{arm['tokens_after_mean']:,.0f} / {arm['tokens_after_p95']:,}"
                f" / {arm['tokens_after_peak']:,}",
                f"{arm['reduction']:.1%}",
                *cost_cells(arm),
                str(arm["compaction_events"]),
                str(arm["summarizer_calls"]),
                _share(arm["prefix_stability"]),
                *[_survival_cell(arm["survival"].get(k, {})) for k in kinds],
                str(arm["protocol_violations"]),
            ]
        )
    return rows


def accuracy_table(results: dict[str, Any]) -> list[list[str]]:
    kinds = kinds_in(results)
    rows = [["arm", "source", "all", *[KIND_LABELS.get(k, k) for k in kinds]]]
    for arm in results["arms"].values():
        for label, accuracy in (arm.get("accuracy") or {}).items():
            for source in ("exact", "judge"):
                table = accuracy.get(source) or {}
                if not table:
                    continue

                def cell(scope: str, table: dict[str, Any] = table) -> str:
                    item = table.get(scope)
                    if not item:
                        return "-"
                    spread = f" ({item['min']:.0%}-{item['max']:.0%})" if item["repeats"] > 1 else ""
                    return f"{item['mean']:.0%}{spread}"

                rows.append([label, source, cell("all"), *[cell(k) for k in kinds]])
    return rows if len(rows) > 1 else []


def _markdown(rows: Sequence[Sequence[str]]) -> str:
    if not rows:
        return ""
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "|".join("---" for _ in rows[0]) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
    return "\n".join(lines)


def summary_markdown(results: dict[str, Any]) -> str:
    run = results["run"]
    cases = results["cases"]
    window = run["context_window"]
    lines = [
        "# Replay summary",
        "",
        f"{cases['used']} cases ({sum(cases['rejected'].values())} rejected), "
        f"{sum(cases['questions'].values())} questions, mode {run['mode']}, "
        f"context window {'forced to ' + format(window, ',') if window else 'as configured'}, "
        f"summaries by {run['summarizer']}; {run['seconds']} s.",
        "",
        "Survived = the evidence of the question is in the arm's view at the question point, or a "
        "scripted reader got it back through the running proxy with read_tool_output, within the "
        "proxy's limits and window (via handle). Reduction = 1 - tokens after / tokens before over "
        "all requests.",
        "",
        _markdown(main_table(results)),
    ]
    reads = reads_table(results)
    if reads:
        lines += ["", "## Stored vs read back", "", READS_NOTE, "", _markdown(reads)]
    note = cost_note(results)
    if note:
        lines += ["", note]
    accuracy = accuracy_table(results)
    if accuracy:
        lines += [
            "",
            f"## Answer accuracy (answering model {run['answer_model']}, judge {run['judge_model']})",
            "",
            "Mean over repeats, range in brackets. `full_repeat` is the full arm answered again "
            "(A/A'): their difference is the noise floor.",
            "",
            _markdown(accuracy),
        ]
    per_success = per_success_table(results)
    if per_success:
        lines += ["", "## Cost per successful answer", "", _markdown(per_success)]
    drift = drift_rows(results)
    if drift:
        lines += ["", "## State contract by compaction cycles", "", DRIFT_NOTE, "", _markdown(drift)]
    if cases["rejected"]:
        lines += ["", "## Rejected cases", ""]
        lines += [f"- {reason}: {count}" for reason, count in sorted(cases["rejected"].items())]
    omitted = cases.get("questions_omitted") or {}
    if omitted:
        lines += ["", "## Questions omitted", ""]
        for kind, reasons in sorted(omitted.items()):
            lines += [f"- {kind}: " + ", ".join(f"{r} ({n})" for r, n in sorted(reasons.items()))]
    gate = results.get("gate")
    if gate:
        lines += ["", f"## Release gate: {'PASSED' if gate['passed'] else 'FAILED'}", ""]
        for arm, verdict in gate["verdicts"].items():
            status = "pass" if verdict["passed"] else "FAIL: " + "; ".join(verdict["failures"])
            lines.append(f"- {arm}: {status}")
    return "\n".join(lines) + "\n"


def console_table(results: dict[str, Any]) -> str:
    rows = main_table(results)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) for row in rows]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def _html_table(rows: Sequence[Sequence[str]]) -> str:
    if not rows:
        return ""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows[1:])
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def report_html(results: dict[str, Any]) -> str:
    series = results.get("series") or {}
    before = results.get("series_before") or {}
    charts = []
    if before:
        case_id = max(before, key=lambda c: len(before[c]))
        per_arm: dict[str, Sequence[float]] = {"original": before[case_id]}
        per_arm.update({arm: values[case_id] for arm, values in series.items() if case_id in values})
        charts.append(line_chart(per_arm, f"Context tokens per request: {case_id} (the longest case)"))
        longest = max(len(v) for v in before.values())
        mean_series: dict[str, Sequence[float]] = {}
        for name, table in [("original", before), *series.items()]:
            means = []
            for i in range(longest):
                values = [v[i] for v in table.values() if len(v) > i]
                means.append(sum(values) / len(values) if values else 0.0)
            mean_series[name] = means
        charts.append(line_chart(mean_series, "Mean context tokens per request index, all cases"))
    markdown_notes = html.escape(summary_markdown(results).split("\n\n", 2)[1])
    sections = [
        "<h1>Replay report</h1>",
        f"<p>{markdown_notes}</p>",
        _html_table(main_table(results)),
        f"<p>{html.escape(cost_note(results))}</p>",
        "<h2>Context tokens per request (the sawtooth)</h2>",
        *[f"<div>{c}</div>" for c in charts],
        "<h2>Evidence survival by question kind</h2>",
        survival_bars(results),
        "<h2>Reduction vs survival</h2>",
        cost_survival_scatter(results),
    ]
    accuracy = accuracy_table(results)
    if accuracy:
        sections += ["<h2>Answer accuracy</h2>", _html_table(accuracy)]
    per_success = per_success_table(results)
    if per_success:
        sections += ["<h2>Cost per successful answer</h2>", _html_table(per_success)]
    drift = drift_rows(results)
    if drift:
        sections += [
            "<h2>State contract by compaction cycles</h2>",
            f"<p>{html.escape(DRIFT_NOTE)}</p>",
            _html_table(drift),
        ]
        examples = failing_examples_html(results)
        if examples:
            sections += ["<h2>Failing examples (one lost fact per arm and kind)</h2>", examples]
    lost = [q for q in results["questions"] if q.get("survival") == "lost"]
    if lost:
        rows = [["arm", "question", "missing evidence"]]
        rows += [[q["arm"], q["question_id"], "; ".join(q.get("missing") or [])[:200]] for q in lost[:300]]
        sections += [f"<h2>Lost evidence ({len(lost)} question-arm pairs)</h2>", _html_table(rows)]
    gate = results.get("gate")
    if gate:
        rows = [["arm", "verdict", "failing figures"]]
        rows += [
            [arm, "pass" if v["passed"] else "FAIL", "; ".join(v["failures"])]
            for arm, v in gate["verdicts"].items()
        ]
        sections += [f"<h2>Release gate: {'passed' if gate['passed'] else 'FAILED'}</h2>", _html_table(rows)]
    style = (
        "body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}"
        "table{border-collapse:collapse;font-size:12px;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}"
        "td:first-child,th:first-child{text-align:left}"
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>Replay report</title>"
        f"<style>{style}</style></head><body>" + "".join(sections) + "</body></html>\n"
    )
