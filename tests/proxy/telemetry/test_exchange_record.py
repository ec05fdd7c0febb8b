"""Observers read a sealed record: once the finishing steps ran, a write to the request's
``Exchange`` raises, so no observer can change what another one reads."""

from __future__ import annotations

import time
from dataclasses import fields, replace

import pytest

from policies.facts import StageFacts
from policies.pipeline import Checkpoint, Offload, PolicyOutcome
from proxy.telemetry.exchange import Exchange, SealedExchange, kept_for_event


def test_a_sealed_exchange_reads_as_before_and_refuses_writes() -> None:
    exchange = Exchange(request_id="cpx-1", route="chat", method="POST", started=time.perf_counter())
    exchange.tokens_before, exchange.status = 1200, 200
    exchange.seal()
    assert isinstance(exchange, SealedExchange)
    assert (exchange.tokens_before, exchange.status, exchange.route) == (1200, 200, "chat")
    with pytest.raises(AttributeError, match="sealed: status"):
        exchange.status = 500
    with pytest.raises(AttributeError, match="sealed"):
        exchange.mark_responded()
    assert exchange.status == 200


@pytest.mark.parametrize("trigger", ["threshold", None])
def test_the_outcome_kept_for_the_event_is_the_outcome_without_what_the_event_drops(
    trigger: str | None,
) -> None:
    outcome = PolicyOutcome(
        messages=[{"role": "user", "content": "view"}],
        tokens_before=900,
        tokens_after=400,
        mechanisms=("offload",),
        checkpoint=Checkpoint(requests=7),
        facts=StageFacts(),
        offloads={"out_1": Offload("out_1", "the whole output", "run | 1 line")},
        original=[{"role": "user", "content": "client"}],
        trigger=trigger,
        origin=(0,),
    )
    # The outcome is copied field by field: a field added to it must be carried over there.
    assert [f.name for f in fields(PolicyOutcome)] == [
        "messages",
        "tokens_before",
        "tokens_after",
        "mechanisms",
        "checkpoint",
        "facts",
        "offloads",
        "original",
        "trigger",
        "origin",
    ]
    expected = replace(
        outcome,
        messages=outcome.messages if trigger else None,
        original=(),
        origin=outcome.origin if trigger else None,
        offloads={"out_1": Offload("out_1", "", "run | 1 line")},
    )
    assert kept_for_event(outcome) == expected
