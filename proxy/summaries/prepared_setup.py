"""Summaries prepared ahead as the app builds them (``prepared.py``): the settings that turn
them on, the metrics their outcomes and tokens go to, and where their tokens wait for the
session's next request (the compaction's own cost, ``proxy/telemetry/compaction_cost.py``)."""

from __future__ import annotations

from policies.tokens import TokenCounter
from proxy.config.settings import Settings
from proxy.summaries.prepared import PreparedSummaries
from proxy.summaries.prepared_store import make_prepared_store
from proxy.telemetry.compaction_cost import PreparationSpend, arm_label
from proxy.telemetry.metrics import Metrics


def make_prepared(
    settings: Settings,
    counter: TokenCounter,
    metrics: Metrics,
    store: object | None,
    spend: PreparationSpend | None = None,
) -> PreparedSummaries | None:
    """Summaries prepared ahead, with a model summarizer and ``summarizer.prepare_at`` set;
    ``store``: shared with the other processes on it (replicas on Redis, workers); ``spend``:
    where their tokens wait for the session's next request (its event carries them)."""
    summarizer = settings.summarizer
    if summarizer.kind != "openai" or summarizer.prepare_at is None:
        return None

    def spent(session: str, arm: str | None, input_tokens: int, output_tokens: int) -> None:
        metrics.prepared_summary_tokens.labels("input").inc(input_tokens)
        metrics.prepared_summary_tokens.labels("output").inc(output_tokens)
        metrics.compaction_tokens.labels("input", "preparation", arm_label(arm)).inc(input_tokens)
        metrics.compaction_tokens.labels("output", "preparation", arm_label(arm)).inc(output_tokens)
        if spend is not None:
            spend.add(session, input_tokens, output_tokens)

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
