"""Summaries prepared ahead as the app builds them (``prepared.py``): the settings that turn
them on, the metrics their outcomes and tokens go to, and where a finished preparation is
recorded at once (its own event and the canary book: the compaction's own cost,
``proxy/telemetry/compaction_cost.py``)."""

from __future__ import annotations

from typing import Any

from policies.tokens import TokenCounter
from proxy.config.settings import Settings
from proxy.summaries.prepared import PreparedSummaries
from proxy.summaries.prepared_store import make_prepared_store
from proxy.telemetry.compaction_cost import Preparation, Preparations, PreparedFor, arm_label
from proxy.telemetry.metrics import Metrics


def make_prepared(
    settings: Settings,
    counter: TokenCounter,
    metrics: Metrics,
    store: object | None,
    preparations: Preparations | None = None,
) -> PreparedSummaries | None:
    """Summaries prepared ahead, with a model summarizer and ``summarizer.prepare_at`` set;
    ``store``: shared with the other processes on it (replicas on Redis, workers);
    ``preparations``: where each finished preparation's tokens are recorded."""
    summarizer = settings.summarizer
    if summarizer.kind != "openai" or summarizer.prepare_at is None:
        return None

    def spent(tenant: str, session: str, whose: Any, input_tokens: int, output_tokens: int) -> None:
        whose = whose if isinstance(whose, PreparedFor) else PreparedFor()
        arm = arm_label(whose.arm)
        metrics.prepared_summary_tokens.labels("input").inc(input_tokens)
        metrics.prepared_summary_tokens.labels("output").inc(output_tokens)
        metrics.compaction_tokens.labels("input", "preparation", arm).inc(input_tokens)
        metrics.compaction_tokens.labels("output", "preparation", arm).inc(output_tokens)
        if preparations is not None:
            preparations.finished(Preparation(tenant, session, whose, input_tokens, output_tokens))

    return PreparedSummaries(
        max_tokens=summarizer.max_output_tokens,
        count=lambda text: counter.count_text(text, settings.tokens.default_encoding),
        concurrency=summarizer.prepare_concurrency,
        queue=summarizer.prepare_queue,
        timeout=summarizer.timeout,
        max_sessions=settings.sessions.max_sessions,
        counted=lambda result: metrics.prepared_summaries.labels(result).inc(),
        missed=lambda reason: metrics.prepared_summaries_missed.labels(reason).inc(),
        depth=metrics.prepared_summaries_queued.set,
        shared=make_prepared_store(store) if store is not None else None,
        spent=spent,
    )
