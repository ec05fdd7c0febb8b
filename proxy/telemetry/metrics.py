"""Prometheus metrics, one registry per app (no global default registry).

Labels carry only bounded, non-secret values: route family, policy name, mode, status
class, error kind. Never a session, key or any content.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client.exposition import CONTENT_TYPE_LATEST

_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
)
_OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)
_TOKEN_BUCKETS = (
    500,
    1_000,
    2_000,
    4_000,
    8_000,
    16_000,
    32_000,
    64_000,
    128_000,
    256_000,
    512_000,
    1_000_000,
)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    """The app's metrics, registered on its own registry, one helper per concern.

    The attribute names, metric names, labels and help texts are read by tests/ and
    deploy's Grafana dashboard: they must not change.
    """

    requests: Counter
    errors: Counter
    upstream_seconds: Histogram
    overhead_seconds: Histogram
    ttfb_seconds: Histogram
    tokens_before: Histogram
    tokens_after: Histogram
    tokens_saved: Counter
    reads: Counter
    read_rounds: Histogram
    compactions: Counter
    compaction_points: Counter
    offloaded: Counter
    offloaded_bytes: Counter
    no_read_room: Counter
    models_defaulted: Counter
    windows_learned: Counter
    summaries: Counter
    summary_seconds: Histogram
    prepared_summaries: Counter
    prepared_summary_tokens: Counter
    prepared_summaries_missed: Counter
    prepared_summaries_queued: Gauge
    summary_wait_seconds: Histogram
    compaction_tokens: Counter
    shadow_compares: Counter
    canary_requests: Counter
    canary_tokens: Counter
    canary_outcomes: Counter
    canary_cost: Counter
    canary_rollbacks: Counter
    canary_paused: Gauge
    canary_book_incidents: Counter

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        # Registration order is exposition order: keep it.
        self._register_requests()
        self._register_context_tokens()
        self._register_reads()
        self._register_compaction()
        self._register_summarizer()
        self._register_shadow()
        self._register_canary()

    def _register_requests(self) -> None:
        """Requests answered, errors and where the time went."""
        r = self.registry
        self.requests = Counter(
            "compaction_proxy_requests",
            "Requests answered, by route family, policy, mode and status class.",
            ("route", "policy", "mode", "status_class"),
            registry=r,
        )
        self.model_requests = Counter(
            "compaction_proxy_model_requests",
            "Requests by the model the client named (the first 64 names; later ones as `other`).",
            ("model",),
            registry=r,
        )
        self.errors = Counter(
            "compaction_proxy_errors",
            "Errors by kind (upstream_unreachable, upstream_timeout, store_write...).",
            ("kind",),
            registry=r,
        )
        self.upstream_seconds = Histogram(
            "compaction_proxy_upstream_seconds",
            "Time from sending the request upstream to the end of its response.",
            ("route",),
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.overhead_seconds = Histogram(
            "compaction_proxy_overhead_seconds",
            "Proxy's own time per request: total time minus time waiting on the upstream.",
            ("route",),
            buckets=_OVERHEAD_BUCKETS,
            registry=r,
        )
        self.ttfb_seconds = Histogram(
            "compaction_proxy_stream_ttfb_seconds",
            "Time from receiving a streaming request to relaying its first body chunk.",
            ("policy",),
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

    def _register_context_tokens(self) -> None:
        """Prompt tokens before and after compaction, and the difference."""
        r = self.registry
        self.tokens_before = Histogram(
            "compaction_proxy_context_tokens_before",
            "Prompt tokens of chat requests as the client sent them.",
            ("policy", "mode"),
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.tokens_after = Histogram(
            "compaction_proxy_context_tokens_after",
            "Prompt tokens of chat requests as sent upstream (in shadow mode: the computed view).",
            ("policy", "mode"),
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.tokens_saved = Counter(
            "compaction_proxy_tokens_saved",
            "Prompt tokens removed by compaction (before minus after), summed.",
            ("policy", "mode"),
            registry=r,
        )

    def _register_reads(self) -> None:
        """read_tool_output calls answered inside the proxy."""
        r = self.registry
        self.reads = Counter(
            "compaction_proxy_read_tool_output_calls",
            "read_tool_output calls answered inside the proxy, by result "
            "(ok, not_found, expired, bad_arguments).",
            ("result",),
            registry=r,
        )
        self.read_rounds = Histogram(
            "compaction_proxy_read_tool_output_rounds",
            "Upstream rounds spent answering read_tool_output per request that offered it.",
            buckets=(0, 1, 2, 3, 4, 6, 8),
            registry=r,
        )

    def _register_compaction(self) -> None:
        """Compaction points, tool outputs offloaded to the store, sessions without read room."""
        r = self.registry
        self.compactions = Counter(
            "compaction_proxy_compactions",
            "Compaction points by policy, mechanism applied and trigger "
            "(threshold, repeated, forced, safeguard, reverted).",
            ("policy", "mechanism", "trigger"),
            registry=r,
        )
        self.compaction_points = Counter(
            "compaction_proxy_compaction_points",
            "Compaction points by policy and trigger, each counted once (compactions_total counts "
            "each mechanism a point applied).",
            ("policy", "trigger"),
            registry=r,
        )
        self.remote_compactions = Counter(
            "compaction_proxy_remote_compactions",
            "Remote compaction answered by the proxy (trigger, endpoint), its items put back in "
            "later inputs (expanded), and items refused (refused: forged, another key's, unknown).",
            ("result",),
            registry=r,
        )
        self.offloaded = Counter(
            "compaction_proxy_outputs_offloaded",
            "Tool outputs saved to the store and replaced by a handle.",
            ("policy",),
            registry=r,
        )
        self.offloaded_bytes = Counter(
            "compaction_proxy_outputs_offloaded_bytes",
            "Bytes of the tool outputs saved to the store.",
            ("policy",),
            registry=r,
        )
        self.no_read_room = Counter(
            "compaction_proxy_no_read_room_sessions",
            "Sessions whose fixed part (system prompt, tools, task, final step, the answer's reserve) "
            "leaves less than the read room free under the window: counted once per session.",
            ("policy",),
            registry=r,
        )
        self.windows_learned = Counter(
            "compaction_proxy_model_windows_learned",
            "Context windows the upstream told the proxy, by how (metadata, refusal) and what "
            "the proxy did with a refused request (retried: compacted to the window and sent "
            "again once; relayed: the refusal went to the client; unfit: even compacted it would "
            "not fit, so the refusal went to the client).",
            ("source", "result"),
            registry=r,
        )
        self.models_defaulted = Counter(
            "compaction_proxy_model_window_defaulted",
            "Model names no pattern of the models table matches (each then gets the default "
            "window), counted once per name for the first 32 names.",
            ("model",),
            registry=r,
        )

    def _register_summarizer(self) -> None:
        """Summaries made and the time they took."""
        r = self.registry
        self.summaries = Counter(
            "compaction_proxy_summarizer_calls",
            "Summaries made, by outcome: ok (model), ledger (model-free), fallback (model failed).",
            ("outcome",),
            registry=r,
        )
        self.summary_seconds = Histogram(
            "compaction_proxy_summarizer_seconds",
            "Time spent making a summary.",
            buckets=(0.001, 0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=r,
        )
        self.prepared_summaries = Counter(
            "compaction_proxy_prepared_summaries",
            "Summaries prepared ahead (summarizer.prepare_at), by result: prepared, used, none_ready, "
            "stale (the conversation changed under it), rejected (failed a check), failed, dropped "
            "(its tenant's queue was full), superseded (a newer range of its session).",
            ("result",),
            registry=r,
        )
        self.prepared_summary_tokens = Counter(
            "compaction_proxy_prepared_summary_tokens",
            "The summarizer's tokens spent preparing summaries ahead (used or not), by kind: input, output.",
            ("kind",),
            registry=r,
        )
        self.prepared_summaries_missed = Counter(
            "compaction_proxy_prepared_summaries_missed",
            "Compaction points that found no prepared summary ready, by why: queued (its preparation "
            "waited for a slot), running, dropped (its tenant's queue was full), failed, "
            "unanswered (a keyless summarizer prepares only for tenants the upstream answered), none.",
            ("reason",),
            registry=r,
        )
        self.prepared_summaries_queued = Gauge(
            "compaction_proxy_prepared_summaries_queued",
            "Preparations waiting for a slot (summarizer.prepare_concurrency), all tenants.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.summary_wait_seconds = Histogram(
            "compaction_proxy_summary_wait_seconds",
            "How long a compaction point waited for its summary (the agent's step waits with it).",
            buckets=(0.0001, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5, 30, 120),
            registry=r,
        )
        self.compaction_tokens = Counter(
            "compaction_proxy_compaction_tokens",
            "The compaction's own tokens (the summarizer's, apart from the prompt), by kind "
            "(input, output), source (point: a summary made at a compaction point; preparation: "
            "summaries prepared ahead, used or not) and arm (treated, holdout; none outside canary mode).",
            ("kind", "source", "arm"),
            registry=r,
        )

    def _register_shadow(self) -> None:
        """Shadow mode's comparison of the next decision."""
        self.shadow_compares = Counter(
            "compaction_proxy_shadow_compares",
            "Shadow comparisons of the next decision, real answer vs compacted view: same, diverged, error.",
            ("policy", "result"),
            registry=self.registry,
        )

    def _register_canary(self) -> None:
        """Canary mode: what each arm's requests came to, and the gate's pauses."""
        r = self.registry
        self.canary_requests = Counter(
            "compaction_proxy_canary_requests",
            "Canary requests by arm (treated, holdout) and door.",
            ("arm", "route"),
            registry=r,
        )
        self.canary_tokens = Counter(
            "compaction_proxy_canary_tokens",
            "Tokens the upstream reported per arm: prompt, cached (read from the prompt cache), "
            "cache_write, output.",
            ("arm", "kind"),
            registry=r,
        )
        self.canary_outcomes = Counter(
            "compaction_proxy_canary_outcomes",
            "What canary requests came to, per arm: context_error (judged), view_error (the "
            "compacted view refused or the proxy failing: judged), client_error and "
            "upstream_error (not judged), read (read_tool_output call), repeat (a tool call the "
            "agent made again), agent_compaction, final_answer, tool_call.",
            ("arm", "outcome"),
            registry=r,
        )
        self.canary_cost = Counter(
            "compaction_proxy_canary_cost",
            "Effective cost per arm: US dollars where the models table has prices, else full-price "
            "input tokens.",
            ("arm",),
            registry=r,
        )
        self.canary_rollbacks = Counter(
            "compaction_proxy_canary_rollbacks",
            "Times the canary gate paused the policy (new sessions to the holdout).",
            registry=r,
        )
        self.canary_paused = Gauge(
            "compaction_proxy_canary_paused",
            "1 while the canary is paused by its gate.",
            registry=r,
            multiprocess_mode="max",
        )
        self.canary_book_incidents = Counter(
            "compaction_proxy_canary_book_incidents",
            "The canary's shared book misbehaving, by kind: judge_failed (a judgment that could "
            "not read or write it), arm_unread (a paused session's arm unread: sent to the "
            "holdout), damaged (a judgment that found an unreadable pause, epoch or session), "
            "pause_restored (a pause the book lost, put back).",
            ("kind",),
            registry=r,
        )

    def render(self) -> bytes:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            # Several worker processes: every worker's values, merged from their files.
            merged = CollectorRegistry()
            multiprocess.MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
            return generate_latest(merged)
        return generate_latest(self.registry)
