"""What ``wrap`` says when the agent exits: the difference of the proxy's own metrics before
and after the run (exact with a proxy started for the run; with a shared one, other clients'
traffic in the same minutes is counted too), in words or as one JSON object."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

from policies.windows import ContextWindows

_TOTALS = {
    "compaction_proxy_context_tokens_before_sum": "tokens_before",
    "compaction_proxy_context_tokens_after_sum": "tokens_after",
    "compaction_proxy_compaction_points_total": "compaction_points",
    "compaction_proxy_read_tool_output_calls_total": "reads",
}


@dataclass(frozen=True)
class Figures:
    """What the proxy's metrics said at one moment."""

    requests: float = 0.0
    tokens_before: float = 0.0
    tokens_after: float = 0.0
    compaction_points: float = 0.0
    reads: float = 0.0
    # Answers that were not 2xx, by status class (4xx, 5xx), and calls upstream that failed
    # (unreachable, timed out...), by kind.
    failed_answers: Mapping[str, float] = field(default_factory=dict)
    upstream_failures: float = 0.0
    # Requests per policy and mode ("improved/enforce"), and per model the client named.
    policies: Mapping[str, float] = field(default_factory=dict)
    models: Mapping[str, float] = field(default_factory=dict)

    @property
    def errors(self) -> float:
        return sum(self.failed_answers.values())

    def minus(self, earlier: Figures) -> Figures:
        def less(now: Mapping[str, float], then: Mapping[str, float]) -> dict[str, float]:
            return {k: v - then.get(k, 0.0) for k, v in now.items() if v - then.get(k, 0.0) > 0}

        return Figures(
            requests=self.requests - earlier.requests,
            tokens_before=self.tokens_before - earlier.tokens_before,
            tokens_after=self.tokens_after - earlier.tokens_after,
            compaction_points=self.compaction_points - earlier.compaction_points,
            reads=self.reads - earlier.reads,
            failed_answers=less(self.failed_answers, earlier.failed_answers),
            upstream_failures=self.upstream_failures - earlier.upstream_failures,
            policies=less(self.policies, earlier.policies),
            models=less(self.models, earlier.models),
        )


def _add(into: dict[str, float], key: str, value: float) -> None:
    into[key] = into.get(key, 0.0) + value


def parse_figures(exposition: str) -> Figures:
    totals: dict[str, float] = {}
    failed: dict[str, float] = {}
    policies: dict[str, float] = {}
    models: dict[str, float] = {}
    upstream = 0.0
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if name in _TOTALS:
                totals[_TOTALS[name]] = totals.get(_TOTALS[name], 0.0) + value
            elif name == "compaction_proxy_requests_total":
                totals["requests"] = totals.get("requests", 0.0) + value
                _add(policies, f"{labels.get('policy', '-')}/{labels.get('mode', '-')}", value)
                if labels.get("status_class") in ("4xx", "5xx"):
                    _add(failed, labels["status_class"], value)
            elif name == "compaction_proxy_model_requests_total":
                _add(models, labels.get("model", "?"), value)
            elif name == "compaction_proxy_errors_total" and labels.get("kind", "").startswith("upstream_"):
                upstream += value
    return Figures(
        **totals,
        failed_answers=failed,
        upstream_failures=upstream,
        policies=policies,
        models=models,
    )


@dataclass(frozen=True)
class RunFacts:
    """What the summary says beside the figures."""

    session: str
    proxy_url: str
    shared: bool
    log_path: Path | None
    # The proxy's own default policy and mode, and its windows table (from its /readyz).
    policy: str
    mode: str
    windows: Mapping[str, int]
    events_command: str
    # The windows the proxy's upstreams told it by the end of the run (model to tokens).
    learned: Mapping[str, int] = field(default_factory=dict)


def _windows(figures: Figures, facts: RunFacts) -> dict[str, int]:
    table = ContextWindows(facts.windows) if facts.windows else None
    if table is None:
        return {}
    return {m: facts.learned.get(m) or table.window_for(m) for m in figures.models if m != "other"}


def _policies(figures: Figures, facts: RunFacts) -> str:
    # Passthrough requests (no policy) say "-".
    named = sorted(p for p in figures.policies if not p.startswith("-"))
    return ", ".join(named) if named else f"{facts.policy}/{facts.mode} (the proxy's default)"


def summary_lines(figures: Figures, facts: RunFacts) -> list[str]:
    """The summary in words."""
    if figures.requests < 1:
        lines = [
            f"compaction-proxy: the agent sent no request to the proxy in session {facts.session}: "
            "it was likely not pointed at it (its own configuration names another base URL, or it "
            "never reached a model)",
        ]
        return [*lines, *_where(facts)]
    saved = figures.tokens_before - figures.tokens_after
    share = f" ({saved / figures.tokens_before:.0%})" if figures.tokens_before else ""
    lines = [
        f"compaction-proxy: {figures.requests:.0f} requests in session {facts.session}, "
        f"policy {_policies(figures, facts)}",
    ]
    windows = _windows(figures, facts)
    if windows:
        lines.append("  windows: " + ", ".join(f"{m} {w:,} tokens" for m, w in sorted(windows.items())))
    lines += [
        f"  prompt tokens: {figures.tokens_before:,.0f} sent by the agent, "
        f"{figures.tokens_after:,.0f} upstream",
        f"  saved: {saved:,.0f} prompt tokens{share}",
        f"  compaction points: {figures.compaction_points:.0f}, saved outputs read back: {figures.reads:.0f}",
    ]
    if figures.errors or figures.upstream_failures:
        classes = ", ".join(f"{n:.0f} {c}" for c, n in sorted(figures.failed_answers.items()))
        lines.append(
            f"  errors: {figures.errors:.0f} of {figures.requests:.0f} answers were not 2xx"
            + (f" ({classes})" if classes else "")
            + f", {figures.upstream_failures:.0f} upstream failures (see the proxy's log)"
        )
    if figures.errors and figures.errors >= figures.requests:
        lines.append("  every request failed: nothing reached a model, so nothing could be compacted")
    elif figures.compaction_points == 0:
        lines.append(
            f"  nothing was compacted: every request stayed under {_policies(figures, facts)}'s trigger"
            + (" for its window" if windows else "")
        )
    return [*lines, *_where(facts)]


def _where(facts: RunFacts) -> list[str]:
    lines = []
    if facts.shared:
        lines.append("  (a proxy that was already running: its other clients' traffic is counted too)")
    if facts.log_path is not None:
        lines.append(f"  proxy log: {facts.log_path}")
    where = "  (run it where that proxy runs, with its --config)" if facts.shared else ""
    lines.append(f"  events: {facts.events_command}{where}")
    return lines


def summary_json(figures: Figures, facts: RunFacts) -> bytes:
    """The same facts as one JSON object."""
    summary: dict[str, Any] = {
        "session": facts.session,
        "proxy_url": facts.proxy_url,
        "requests": round(figures.requests),
        "no_requests": figures.requests < 1,
        "policies": sorted(p for p in figures.policies if not p.startswith("-")),
        "default_policy": facts.policy,
        "mode": facts.mode,
        "models": {m: round(n) for m, n in sorted(figures.models.items())},
        "windows": _windows(figures, facts),
        "tokens_before": round(figures.tokens_before),
        "tokens_after": round(figures.tokens_after),
        "tokens_saved": round(figures.tokens_before - figures.tokens_after),
        "compaction_points": round(figures.compaction_points),
        "reads": round(figures.reads),
        "errors": round(figures.errors),
        "failed_answers": {c: round(n) for c, n in sorted(figures.failed_answers.items())},
        "upstream_failures": round(figures.upstream_failures),
        "shared_proxy": facts.shared,
        "proxy_log": str(facts.log_path) if facts.log_path else None,
        "events_command": facts.events_command,
    }
    return orjson.dumps(summary)
