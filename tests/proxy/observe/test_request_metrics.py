"""Request metrics go to the series their labels name, each found once per label set."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry

from proxy.observe.observers import RequestMetrics
from proxy.telemetry.exchange import Exchange
from proxy.telemetry.metrics import Metrics


def answered(status: int, policy: str, before: int, after: int) -> Exchange:
    exchange = Exchange(request_id="r", route="chat", method="POST", started=time.perf_counter())
    exchange.status, exchange.policy, exchange.mode = status, policy, "enforce"
    exchange.tokens_before, exchange.tokens_after, exchange.upstream_seconds = before, after, 0.5
    return exchange


def test_each_label_set_counts_alone() -> None:
    registry = CollectorRegistry()
    observer = RequestMetrics(Metrics(registry))
    for exchange in (
        answered(200, "improved", 900, 400),
        answered(200, "improved", 800, 800),
        answered(502, "improved", 700, 700),
        answered(200, "full", 500, 500),
    ):
        observer.observe(exchange)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    requests = "compaction_proxy_requests_total"
    assert value(requests, route="chat", policy="improved", mode="enforce", status_class="2xx") == 2
    assert value(requests, route="chat", policy="improved", mode="enforce", status_class="5xx") == 1
    assert value(requests, route="chat", policy="full", mode="enforce", status_class="2xx") == 1
    assert value("compaction_proxy_tokens_saved_total", policy="improved", mode="enforce") == 500
    assert value("compaction_proxy_context_tokens_before_count", policy="improved", mode="enforce") == 3
    assert value("compaction_proxy_upstream_seconds_count", route="chat") == 4
    assert value("compaction_proxy_overhead_seconds_count", route="chat") == 4
    assert len(observer._series) == 3
