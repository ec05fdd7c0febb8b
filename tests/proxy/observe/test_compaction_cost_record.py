"""The compaction record carries the compaction's own cost of a point: in the event, and in
the metrics by source and canary arm; a preparation's tokens are never a request's (its own
event carries them, tests/proxy/telemetry/test_compaction_cost.py)."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry

from policies.facts import StageFacts, SummaryFact
from policies.pipeline import PolicyOutcome
from proxy.observe.observers import CompactionRecord
from proxy.telemetry.compaction_cost import CompactionCost
from proxy.telemetry.exchange import Exchange
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.shadow import ShadowComparer


class Sink:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def emit(self, event: dict[str, Any], checkpoint: Any = None) -> None:
        self.events.append(dict(event))


def record(registry: CollectorRegistry, sink: Sink) -> CompactionRecord:
    return CompactionRecord(
        metrics=Metrics(registry),
        events=sink,  # type: ignore[arg-type]
        shadow=ShadowComparer(sample_rate=0.0, max_concurrent=1),
        ask=None,  # type: ignore[arg-type]
        decide=lambda dialect: None,  # type: ignore[arg-type,return-value]
        policy_meta={},
        record_skipped=False,
    )


def finished(summary: SummaryFact | None, arm: str | None) -> Exchange:
    exchange = Exchange(request_id="r", route="chat", method="POST", started=time.perf_counter())
    exchange.session, exchange.tenant, exchange.policy, exchange.arm = "s_1:improved", "t_a", "improved", arm
    exchange.status = 200
    trigger = "threshold" if summary is not None else None
    exchange.outcome = PolicyOutcome(None, 9000, 3000, facts=StageFacts(summary=summary), trigger=trigger)
    CompactionCost().finish(exchange)
    exchange.seal()
    return exchange


def test_the_event_and_the_metrics_carry_the_point() -> None:
    registry, sink = CollectorRegistry(), Sink()
    observer = record(registry, sink)
    made = SummaryFact(model="small", prompt_family="hybrid", input_tokens=900, output_tokens=120)
    observer.observe(finished(made, "treated"))
    (point,) = sink.events
    assert point["compaction_cost"] == {
        "input_tokens": 900,
        "output_tokens": 120,
        "point": {"input_tokens": 900, "output_tokens": 120},
        "preparation": {"input_tokens": 0, "output_tokens": 0},
    }
    assert "kind" not in point  # a request's event

    def tokens(kind: str, source: str, arm: str) -> float | None:
        labels = {"kind": kind, "source": source, "arm": arm}
        return registry.get_sample_value("compaction_proxy_compaction_tokens_total", labels)

    # The point's own here; a preparation's are counted when spent (prepared_setup.py).
    assert (tokens("input", "point", "treated"), tokens("output", "point", "treated")) == (900, 120)
    assert tokens("input", "preparation", "treated") is None


def test_a_request_the_policy_left_alone_gets_no_event() -> None:
    registry, sink = CollectorRegistry(), Sink()
    record(registry, sink).observe(finished(None, None))
    assert sink.events == []  # nothing done, nothing spent: no event (record_skipped is off)


def test_a_point_with_a_prepared_summary_has_no_point_tokens_and_says_so() -> None:
    registry, sink = CollectorRegistry(), Sink()
    used = SummaryFact(
        model="small", prompt_family="hybrid", input_tokens=900, output_tokens=120, prepared="used"
    )
    record(registry, sink).observe(finished(used, None))
    (point,) = sink.events
    assert point["compaction_cost"]["input_tokens"] == 0 and point["summary"]["input_tokens"] == 900
