"""Observers read a sealed record: once the finishing steps ran, a write to the request's
``Exchange`` raises, so no observer can change what another one reads."""

from __future__ import annotations

import time

import pytest

from proxy.exchange import Exchange, SealedExchange


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
