"""The report's charts as inline SVG (no script, no external resource): context tokens per
request, survival per arm and kind, and cost against survival."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from replay.report.results import KIND_LABELS, kinds_in, survival_share

COLORS = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
]


STATE_COLORS = {"visible": "#2ca02c", "recoverable": "#1f77b4", "lost": "#d62728"}


def line_chart(
    series: dict[str, Sequence[float]],
    title: str,
    width: int = 760,
    height: int = 300,
    y_label: str = "tokens",
) -> str:
    left, right, top, bottom = 70, 170, 30, 40
    longest = max((len(v) for v in series.values()), default=0)
    peak = max((max(v) for v in series.values() if v), default=1) or 1
    plot_w, plot_h = width - left - right, height - top - bottom

    def x(i: int) -> float:
        return left + (plot_w * i / max(1, longest - 1))

    def y(v: float) -> float:
        return top + plot_h - plot_h * v / peak

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">',
        f'<text x="{left}" y="18" font-size="14" font-weight="bold">{html.escape(title)}</text>',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#888"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#888"/>',
    ]
    for fraction in (0, 0.5, 1):
        value = peak * fraction
        parts.append(
            f'<text x="{left - 6}" y="{y(value) + 4:.1f}" font-size="10" text-anchor="end">'
            f"{value:,.0f}</text>"
        )
    parts.append(
        f'<text x="{left + plot_w / 2}" y="{height - 8}" font-size="11" text-anchor="middle">request</text>'
    )
    parts.append(
        f'<text x="14" y="{top + plot_h / 2}" font-size="11" transform="rotate(-90 14 {top + plot_h / 2})" '
        f'text-anchor="middle">{html.escape(y_label)}</text>'
    )
    for index, (name, values) in enumerate(series.items()):
        color = "#000" if name == "original" else COLORS[index % len(COLORS)]
        dash = ' stroke-dasharray="4 3"' if name == "original" else ""
        points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values))
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5"{dash} points="{points}"/>')
        legend_y = top + 14 * index
        parts.append(
            f'<line x1="{left + plot_w + 10}" y1="{legend_y}" x2="{left + plot_w + 28}" y2="{legend_y}" '
            f'stroke="{color}" stroke-width="2"{dash}/>'
            f'<text x="{left + plot_w + 32}" y="{legend_y + 4}" font-size="11">{html.escape(name)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def survival_bars(results: dict[str, Any]) -> str:
    kinds = kinds_in(results)
    arms = list(results["arms"])
    bar_h, gap, left, width = 14, 4, 140, 420
    blocks = []
    for kind in kinds:
        height = 30 + len(arms) * (bar_h + gap)
        parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 20}" height="{height}" '
            'role="img">',
            f'<text x="0" y="16" font-size="13" font-weight="bold">'
            f"{html.escape(KIND_LABELS.get(kind, kind))}</text>",
        ]
        for row, arm in enumerate(arms):
            counts = results["arms"][arm]["survival"].get(kind, {})
            total = sum(counts.values()) or 1
            y = 26 + row * (bar_h + gap)
            parts.append(
                f'<text x="{left - 6}" y="{y + 11}" font-size="11" text-anchor="end">'
                f"{html.escape(arm)}</text>"
            )
            offset = float(left)
            for state in ("visible", "recoverable", "lost"):
                share = counts.get(state, 0) / total
                if share:
                    parts.append(
                        f'<rect x="{offset:.1f}" y="{y}" width="{width * share:.1f}" height="{bar_h}" '
                        f'fill="{STATE_COLORS[state]}"><title>{state}: {counts.get(state, 0)}</title></rect>'
                    )
                offset += width * share
        parts.append("</svg>")
        blocks.append("".join(parts))
    legend = " ".join(f'<span style="color:{c}">&#9632;</span> {s}' for s, c in STATE_COLORS.items())
    return f"<p>{legend}</p>" + "".join(f"<div>{b}</div>" for b in blocks)


def cost_survival_scatter(results: dict[str, Any], width: int = 520, height: int = 340) -> str:
    left, top, plot_w, plot_h = 60, 30, width - 180, height - 80
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">',
        f'<text x="{left}" y="18" font-size="14" font-weight="bold">Reduction vs evidence survival</text>',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#888"/>',
        f'<text x="{left + plot_w / 2}" y="{top + plot_h + 30}" font-size="11" text-anchor="middle">'
        "reduction (share of tokens removed)</text>",
        f'<text x="16" y="{top + plot_h / 2}" font-size="11" transform="rotate(-90 16 {top + plot_h / 2})" '
        'text-anchor="middle">evidence survived (all kinds)</text>',
    ]
    for tick in (0, 0.5, 1):
        parts.append(
            f'<text x="{left + plot_w * tick:.0f}" y="{top + plot_h + 14}" font-size="10" '
            f'text-anchor="middle">{tick:.0%}</text>'
            f'<text x="{left - 6}" y="{top + plot_h - plot_h * tick + 4:.0f}" font-size="10" '
            f'text-anchor="end">{tick:.0%}</text>'
        )
    for index, (name, arm) in enumerate(results["arms"].items()):
        share = survival_share(arm["survival_all"])
        if share is None:
            continue
        cx, cy = left + plot_w * max(0.0, arm["reduction"]), top + plot_h - plot_h * share
        color = COLORS[index % len(COLORS)]
        parts.append(
            f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="5" fill="{color}"><title>{html.escape(name)}: '
            f"{arm['reduction']:.1%} reduction, {share:.0%} survived</title></circle>"
            f'<text x="{left + plot_w + 12}" y="{top + 12 + 14 * index}" font-size="11" fill="{color}">'
            f"&#9679; {html.escape(name)}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)
