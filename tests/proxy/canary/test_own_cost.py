"""The canary arm's cost includes its compaction's own cost (the summarizer's tokens, at the
summarizer model's prices), shown apart; what is saved per session is net of it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from proxy.canary.gate import ArmFigures, Prices, own_cost
from proxy.canary.record import request_figures
from proxy.canary.runtime import canary_report
from proxy.canary.store import Figures
from proxy.commands.canary import render
from proxy.config.sections import CanarySettings
from proxy.dialects.chat import ChatDialect
from proxy.telemetry.compaction_cost import own_cost as own_record
from proxy.telemetry.exchange import AnswerCapture, Exchange

MODEL = Prices(input=2.5, cached_input=1.25, output=10.0)
SMALL = Prices(input=0.15, output=0.6)


def test_the_own_cost_is_in_the_unit_of_the_request_cost() -> None:
    assert own_cost(1_000_000, 100_000, SMALL, MODEL) == 0.15 + 0.06  # the summarizer's prices
    assert own_cost(1_000_000, 0, Prices(), MODEL) == 2.5  # no summarizer price: the model's
    # No price for the request's model: full-price input tokens, output at four times.
    assert own_cost(1_000, 100, SMALL, Prices()) == 1_000 + 400


def answered(own: dict[str, Any] | None) -> Exchange:
    exchange = Exchange(request_id="r", route="chat", method="POST", started=time.perf_counter())
    exchange.status, exchange.arm, exchange.compaction_cost = 200, "treated", own
    capture = AnswerCapture(b'"tool_calls"')
    capture.take(b'{"choices":[],"usage":{"prompt_tokens":1000000,"completion_tokens":0}}')
    exchange.canary_capture = capture
    return exchange


def test_a_request_costs_its_prompt_and_its_compaction_own() -> None:
    plain, _ = request_figures(answered(None), ChatDialect(), MODEL, SMALL)
    assert plain["cost"] == 2.5 and plain["compaction_cost"] == 0.0
    own = own_record((1_000_000, 100_000), (0, 0))
    counted, _ = request_figures(answered(own), ChatDialect(), MODEL, SMALL)
    assert (counted["compaction_input"], counted["compaction_output"]) == (1_000_000, 100_000)
    assert counted["compaction_cost"] == 0.15 + 0.06
    assert counted["cost"] == 2.5 + 0.15 + 0.06


class Book:
    def __init__(self, sessions: list[dict[str, Any]]) -> None:
        self._sessions = sessions

    async def state(self) -> dict[str, Any]:
        return {"epoch": 0.0, "paused": None}

    async def sessions(self, since: float) -> Figures:
        return Figures(self._sessions)


async def test_status_shows_the_own_cost_apart_and_the_savings_net_of_it() -> None:
    now = time.time()
    treated = {"arm": "treated", "tenant": "t", "last": now, "requests": 10, "cost": 3.0}
    treated |= {"compaction_cost": 0.5, "compaction_input": 40_000, "compaction_output": 3_000}
    holdout = {"arm": "holdout", "tenant": "t", "last": now, "requests": 10, "cost": 4.0}
    report = await canary_report(Book([treated, holdout]), CanarySettings(), now)  # type: ignore[arg-type]
    arm = report["arms"]["treated"]
    assert (arm["prompt_cost_per_session"], arm["compaction_cost_per_session"]) == (2.5, 0.5)
    assert arm["cost_per_session"] == 3.0 and arm["compaction_input_tokens"] == 40_000
    assert report["saved_per_session"] == 1.0  # 4.0 - (2.5 + 0.5): net of the own cost
    printed = render(report)
    assert "compaction's own per session" in printed and "saved per session (net)" in printed
    assert ArmFigures("holdout", [holdout]).summary(now, 60)["compaction_cost_per_session"] == 0.0


class Kept:
    """A canary book that keeps what is added."""

    def __init__(self) -> None:
        self.added: list[tuple[str, str, dict[str, float], str | None]] = []

    async def add(self, key: str, arm: str, counted: dict[str, float], last: str | None, now: float) -> None:
        self.added.append((key, arm, dict(counted), last))


async def test_a_preparation_is_its_arms_cost_and_no_request() -> None:
    from prometheus_client import CollectorRegistry

    from proxy.canary.record import CanaryPrices, CanaryRecord
    from proxy.config.settings import load_settings
    from proxy.telemetry.compaction_cost import Preparation, PreparedFor
    from proxy.telemetry.metrics import Metrics

    settings = load_settings(
        env={},
        overrides={
            "summarizer.model": "small",
            "models": {"gpt-4o*": {"input_price": 2.5}, "small": {"input_price": 0.15, "output_price": 0.6}},
        },
    )
    book, registry = Kept(), CollectorRegistry()
    record = CanaryRecord(Metrics(registry), book, CanaryPrices(settings), {}, None)  # type: ignore[arg-type]
    whose = PreparedFor(arm="treated", canary_key="t_a\x1fs", model="gpt-4o")
    record.preparation(Preparation("t_a", "s_1:improved", whose, 1_000_000, 100_000))
    record.preparation(Preparation("t_a", "s_2:improved", PreparedFor(model="gpt-4o"), 5, 5))  # no arm
    await asyncio.gather(*record.pending)
    cost = 0.15 + 0.06
    assert book.added == [
        (
            "t_a\x1fs",
            "treated",
            {
                "compaction_input": 1_000_000,
                "compaction_output": 100_000,
                "compaction_cost": cost,
                "cost": cost,
            },
            None,
        )
    ]  # no "requests": a preparation is no request of the session
    assert registry.get_sample_value("compaction_proxy_canary_cost_total", {"arm": "treated"}) == cost
