"""What ``replay tune`` writes: ``tune.json`` (every candidate), ``tune.md`` (the table),
``frontier.svg`` (effective cost against the lowest survival) and ``winner.yml`` (the winning
policy as a config snippet)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import orjson
import yaml

from replay.tune.search import Measured, TuneState, best, frontier


def winner_snippet(winner: Measured, name: str = "tuned") -> str:
    figures = winner.figures
    header = (
        f"# replay tune: effective cost {winner.effective:.1%} of full, reduction "
        f"{figures.get('reduction', 0):.1%}, lowest survival {winner.min_survival:.1%}; passed the gate\n"
    )
    policy = winner.candidate.policy()
    policy["description"] = f"tuned from {winner.candidate.base}: " + (
        ", ".join(f"{k}={v}" for k, v in winner.candidate.knobs) or "its own settings"
    )
    text: str = yaml.safe_dump({"policies": {name: policy}}, sort_keys=False)
    return header + text


def write_outputs(out: Path, state: TuneState, base: str) -> Measured | None:
    measured = sorted(state.measured.values(), key=lambda m: m.effective)
    front = {m.candidate.name for m in frontier(measured)}
    winner = best(measured)
    rows = [
        {
            "arm": m.candidate.name,
            "knobs": dict(m.candidate.knobs),
            "effective_vs_full": m.effective,
            "reduction": m.figures.get("reduction"),
            "min_survival": m.min_survival,
            "survival": m.figures.get("survival"),
            "passed_gate": m.feasible,
            "gate_failures": m.verdict.get("failures", []),
            "frontier": m.candidate.name in front,
        }
        for m in measured
    ]
    (out / "tune.json").write_bytes(
        orjson.dumps(
            {"base": base, "winner": winner.candidate.name if winner else None, "candidates": rows},
            option=orjson.OPT_INDENT_2,
        )
    )
    lines = [
        f"# replay tune of `{base}`",
        "",
        "| arm | knobs | effective cost vs full | reduction | lowest survival | gate | frontier |",
        "| --- | --- | ---: | ---: | ---: | --- | --- |",
    ]
    for row in rows:
        knobs = ", ".join(f"{k}={v}" for k, v in row["knobs"].items()) or f"({base} as configured)"
        mark = " **winner**" if winner and row["arm"] == winner.candidate.name else ""
        lines.append(
            f"| `{row['arm']}`{mark} | {knobs} | {row['effective_vs_full']:.1%} | "
            f"{(row['reduction'] or 0):.1%} | {row['min_survival']:.1%} | "
            f"{'pass' if row['passed_gate'] else 'fail'} | {'yes' if row['frontier'] else ''} |"
        )
    if winner is None:
        lines += ["", "No candidate passed the release gate: nothing to recommend."]
    else:
        lines += [
            "",
            "Winner as a config snippet (`winner.yml`):",
            "",
            "```yaml",
            winner_snippet(winner),
            "```",
        ]
        (out / "winner.yml").write_text(winner_snippet(winner))
    (out / "tune.md").write_text("\n".join(lines) + "\n")
    (out / "frontier.svg").write_text(frontier_chart(measured, front, winner))
    return winner


def frontier_chart(measured: Sequence[Measured], front: set[str], winner: Measured | None) -> str:
    """Effective cost (x) against the lowest survival (y): a self-contained SVG."""
    width, height, pad = 640, 400, 56
    finite = [m for m in measured if m.effective != float("inf")]
    if not finite:
        return f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"></svg>'
    xs = [m.effective for m in finite]
    ys = [m.min_survival for m in finite]
    x0, x1 = min(xs) - 0.02, max(xs) + 0.02
    y0, y1 = max(0.0, min(ys) - 0.02), min(1.0, max(ys) + 0.01) + 1e-9

    def point(m: Measured) -> tuple[float, float]:
        x = pad + (m.effective - x0) / (x1 - x0) * (width - 2 * pad)
        y = height - pad - (m.min_survival - y0) / (y1 - y0) * (height - 2 * pad)
        return x, y

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif"'
        ' font-size="12">',
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="#333"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="#333"/>',
        f'<text x="{width / 2}" y="{height - 16}" text-anchor="middle">effective cost vs full '
        f"({x0:.0%} to {x1:.0%})</text>",
        f'<text x="16" y="{height / 2}" transform="rotate(-90 16 {height / 2})" text-anchor="middle">'
        f"lowest survival per kind ({y0:.0%} to {y1:.0%})</text>",
    ]
    line = " ".join("{:.1f},{:.1f}".format(*point(m)) for m in finite if m.candidate.name in front)
    if line:
        parts.append(f'<polyline points="{line}" fill="none" stroke="#2a7" stroke-width="1.5"/>')
    for m in finite:
        x, y = point(m)
        colour = "#2a7" if m.feasible else "#c33"
        radius = 7 if winner is not None and m is winner else 4
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{radius}" fill="{colour}"><title>{m.candidate.name}: '
            f"{m.effective:.1%}, {m.min_survival:.1%}</title></circle>"
        )
    parts.append("</svg>")
    return "\n".join(parts)
