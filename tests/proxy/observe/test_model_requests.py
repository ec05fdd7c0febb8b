"""Requests by model name: a series per name for the first 64 names (clients choose names), the
rest counted as ``other``."""

from __future__ import annotations

import time

from proxy.observe.observers import RequestMetrics
from proxy.telemetry.exchange import Exchange
from proxy.telemetry.metrics import Metrics


def test_model_names_are_counted_with_a_bounded_number_of_series() -> None:
    metrics = Metrics()
    observe = RequestMetrics(metrics).observe
    for index in [*range(70), 0, 0]:
        exchange = Exchange(request_id="r", route="chat", method="POST", started=time.perf_counter())
        exchange.model = f"model-{index}"
        observe(exchange)
    passthrough = Exchange(request_id="r", route="passthrough", method="GET", started=time.perf_counter())
    observe(passthrough)  # no model: no series
    text = metrics.render().decode()
    assert text.count("compaction_proxy_model_requests_total{") == 65
    assert 'compaction_proxy_model_requests_total{model="model-0"} 3.0' in text
    assert 'compaction_proxy_model_requests_total{model="other"} 6.0' in text
