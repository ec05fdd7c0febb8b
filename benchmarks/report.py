"""Summaries and Markdown tables of the overhead benchmark.

Kept apart from the driver so the statistics are easy to check: every figure is a median
over repetitions, and every "added" figure is paired, proxy minus direct measured in the
same repetition, before the median is taken (drift between repetitions cancels out).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from probes import SessionSample

Record = dict[str, Any]

BAND_EDGES = (30_000, 60_000, 90_000)
BAND_LABELS = ("2-30k", "30-60k", "60-90k", "90-120k")


def median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (``q`` in 0..100)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize_cell(direct: list[Record], proxy: list[Record]) -> Record:
    """Median of each figure over repetitions, and the paired added latency."""
    row: Record = {"reps": len(proxy)}
    for name, recs in (("direct", direct), ("proxy", proxy)):
        for key in ("p50_ms", "p90_ms", "p99_ms", "rps", "cpu_ms_per_req", "upstream_cpu_ms_per_req"):
            row[f"{name}_{key}"] = median(r.get(key) for r in recs)
        row[f"{name}_requests"] = sum(r["requests"] for r in recs)
        row[f"{name}_errors"] = sum(r["errors"] for r in recs)
        row[f"{name}_capped"] = any(r.get("capped") for r in recs)
    pairs = list(zip(direct, proxy, strict=False))  # repetition by repetition
    for key in ("p50_ms", "p99_ms"):
        row[f"added_{key}"] = median(
            p[key] - d[key] for d, p in pairs if d[key] is not None and p[key] is not None
        )
    row["fwd_kb_per_req"] = median(r.get("fwd_kb_per_req") for r in proxy)
    row["upstream_requests_per_req"] = median(r.get("upstream_requests_per_req") for r in proxy)
    return row


def session_summary(samples: Sequence[SessionSample], skip: int) -> Record:
    """Added latency per token band, and the worst request once past the first ``skip``
    requests (connection set-up and first-use costs are not the steady state)."""
    bands: list[Record] = []
    for index, label in enumerate(BAND_LABELS):
        low = BAND_EDGES[index - 1] if index else -math.inf
        high = BAND_EDGES[index] if index < len(BAND_EDGES) else math.inf
        members = [s for s in samples if low <= s.tokens < high]
        added = [s.added_ms for s in members]
        bands.append(
            {
                "band": label,
                "requests": len(members),
                "direct_p50_ms": percentile([s.direct_ms for s in members], 50),
                "proxy_p50_ms": percentile([s.proxy_ms for s in members], 50),
                "added_p50_ms": percentile(added, 50),
                "added_p99_ms": percentile(added, 99),
                "added_max_ms": max(added) if added else None,
            }
        )
    steady = samples[skip:]
    worst = max(steady, key=lambda s: s.added_ms, default=None)
    return {
        "requests": len(samples),
        "max_tokens": max((s.tokens for s in samples), default=0),
        "bands": bands,
        "steady_skip": skip,
        "steady_added_max_ms": worst.added_ms if worst else None,
        "steady_added_max_at_tokens": worst.tokens if worst else None,
        "steady_added_p50_ms": percentile([s.added_ms for s in steady], 50),
        "samples": [
            {"tokens": s.tokens, "direct_ms": round(s.direct_ms, 3), "proxy_ms": round(s.proxy_ms, 3)}
            for s in samples
        ],
    }


def fmt_ms(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    digits = 3 if abs(value) < 10 else 2 if abs(value) < 100 else 1
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def fmt_num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _table(header: Sequence[str], align: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def cells_markdown(rows: Sequence[Record]) -> list[str]:
    header = [
        "size",
        "mode",
        "c",
        "direct p50",
        "proxy p50",
        "+p50",
        "direct p99",
        "proxy p99",
        "+p99",
        "direct req/s",
        "proxy req/s",
        "proxy CPU ms/req",
        "fwd KB/req",
        "n (proxy)",
        "errors d/p",
    ]
    out = []
    for r in rows:
        capped = " (capped)" if r["direct_capped"] or r["proxy_capped"] else ""
        out.append(
            [
                r["size"],
                r["mode"],
                str(r["conc"]),
                fmt_ms(r["direct_p50_ms"]),
                fmt_ms(r["proxy_p50_ms"]),
                fmt_ms(r["added_p50_ms"], True),
                fmt_ms(r["direct_p99_ms"]),
                fmt_ms(r["proxy_p99_ms"]),
                fmt_ms(r["added_p99_ms"], True),
                fmt_num(r["direct_rps"]),
                fmt_num(r["proxy_rps"]) + capped,
                fmt_ms(r["proxy_cpu_ms_per_req"]),
                fmt_num(r["fwd_kb_per_req"], 1),
                str(r["proxy_requests"]),
                f"{r['direct_errors']}/{r['proxy_errors']}",
            ]
        )
    return _table(header, "lllrrrrrrrrrrrr", out)


def ttfb_markdown(ttfb: dict[str, Record], count: int) -> list[str]:
    header = ["size", "direct first data", "proxy first data", "+first data", "direct end", "proxy end"]
    out = []
    for size, r in ttfb.items():
        if "error" in r:
            out.append([size, r["error"], "", "", "", ""])
            continue
        out.append(
            [
                size,
                fmt_ms(r["direct"]["first_data_ms"]),
                fmt_ms(r["proxy"]["first_data_ms"]),
                fmt_ms(r["added_first_data_ms"], True),
                fmt_ms(r["direct"]["end_ms"]),
                fmt_ms(r["proxy"]["end_ms"]),
            ]
        )
    title = f"### Streaming time to first `data:` (ms, median of {count} sequential requests)"
    return [title, "", *_table(header, "lrrrrr", out)]


def session_markdown(sessions: dict[str, Record]) -> list[str]:
    header = ["run", "band", "n", "direct p50", "proxy p50", "+p50", "+p99", "+max"]
    out = []
    for run, summary in sessions.items():
        for band in (b for b in summary["bands"] if b["requests"]):
            out.append(
                [
                    run,
                    band["band"],
                    str(band["requests"]),
                    fmt_ms(band["direct_p50_ms"]),
                    fmt_ms(band["proxy_p50_ms"]),
                    fmt_ms(band["added_p50_ms"], True),
                    fmt_ms(band["added_p99_ms"], True),
                    fmt_ms(band["added_max_ms"], True),
                ]
            )
    lines = ["### Session-shaped run (one keep-alive connection, ms per request)", ""]
    lines += _table(header, "llrrrrrr", out)
    lines.append("")
    for run, summary in sessions.items():
        lines.append(
            f"- {run}: {summary['requests']} requests up to {summary['max_tokens']:,} tokens; "
            f"steady state (after the first {summary['steady_skip']}): added p50 "
            f"{fmt_ms(summary['steady_added_p50_ms'], True)} ms, max "
            f"{fmt_ms(summary['steady_added_max_ms'], True)} ms "
            f"(at {fmt_num(summary['steady_added_max_at_tokens'])} tokens)"
        )
    return lines


def markdown(
    cells: Sequence[Record], ttfb: dict[str, Record], ttfb_count: int, sessions: dict[str, Record], title: str
) -> str:
    lines = [title, ""]
    if cells:
        lines += ["### Closed-loop load (wrk; ms, medians over repetitions)", "", *cells_markdown(cells), ""]
    if ttfb:
        lines += [*ttfb_markdown(ttfb, ttfb_count), ""]
    if sessions:
        lines += [*session_markdown(sessions), ""]
    return "\n".join(lines)
