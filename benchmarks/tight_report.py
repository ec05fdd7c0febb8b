"""The tight-windows benchmark's Markdown report: one row per (scenario, policy), then the
read rounds' outcomes and the session shapes (docs/benchmarks/index.md explains each column)."""

from __future__ import annotations

from typing import Any

COLUMNS = (
    "scenario",
    "policy",
    "agent req",
    "upstream req",
    "read rounds",
    "points",
    "points / agent req",
    "tail changes",
    "trigger hdr",
    "refused",
    "largest / window",
    "cached % prompt",
    "cached % conversation",
    "cost vs full 4o",
    "cost vs full 4.1",
    "cost vs full Anthropic",
)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def row(r: dict[str, Any]) -> str:
    relative = r.get("cost_vs_full") or {}
    cells = [
        r["scenario"],
        r["policy"],
        str(r["agent_requests"]),
        str(r["upstream_requests"]),
        str(r["read_rounds"]),
        str(r["compaction_points"]),
        f"{r['points_per_agent_request']:.2f}",
        str(r["tail_changes"]),
        str(r["trigger_headers"]),
        str(r["refused_for_window"] + len(r["agent_errors"])),
        f"{r['largest_request']:,} / {r['window']:,}",
        f"{100 * r['cached_share']:.1f}",
        f"{100 * r['conversation_cached_share']:.1f}",
        _ratio(relative.get("gpt-4o")),
        _ratio(relative.get("gpt-4.1")),
        _ratio(relative.get("anthropic")),
    ]
    return "| " + " | ".join(cells) + " |"


def markdown(results: list[dict[str, Any]]) -> str:
    lines = [
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join(["---"] * 2 + ["---:"] * (len(COLUMNS) - 2)) + "|",
        *(row(r) for r in results),
        "",
        "| scenario | policy | steps | finished | fixed prompt + task | step | prompt tokens | cached tokens "
        "| reads made | read outcomes | seconds |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in results:
        outcomes = ", ".join(f"{k} {v}" for k, v in r["read_outcomes"].items()) or "-"
        lines.append(
            f"| {r['scenario']} | {r['policy']} | {r['steps']} / {r['steps_planned']} | "
            f"{'yes' if r['finished'] else 'NO'} | {r['fixed_prompt_tokens']:,} + {r['task_tokens']:,} | "
            f"{r['step_tokens']:,} | {r['prompt_tokens']:,} | {r['cached_tokens']:,} | {r['reads_made']} | "
            f"{outcomes} | {r['seconds']:.1f} |"
        )
    return "\n".join(lines) + "\n"
