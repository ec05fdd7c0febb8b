"""A keyless summarizer prepares only for tenants the upstream has answered."""

from __future__ import annotations

from policies.summarizer import SummaryRequest, SummaryResult
from proxy.summaries.answered import AnsweredTenants
from proxy.summaries.prepared import NeverWaiting, PreparedSummaries
from proxy.telemetry.exchange import Exchange
from tests.proxy.summaries.test_prepared import count, request
from tests.proxy.summaries.test_prepared_replicas import Steps


class Counted(Steps):
    def __init__(self) -> None:
        self.calls = 0

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.calls += 1
        return await super().summarize(request)


def exchange(tenant: str, status: int, upstream_seconds: float = 0.2) -> Exchange:
    found = Exchange("r", "chat", "POST", 0.0, status=status, upstream_seconds=upstream_seconds)
    found.tenant = tenant
    return found


def test_a_tenant_counts_once_the_upstream_answered_it_with_a_success() -> None:
    answered = AnsweredTenants(capacity=2)
    answered.observe(exchange("refused", 401))
    answered.observe(exchange("failed", 502))
    answered.observe(exchange("proxy_only", 200, upstream_seconds=0.0))  # never reached the upstream
    assert "refused" not in answered and "failed" not in answered and "proxy_only" not in answered
    for tenant in ("a", "b", "c"):
        answered.observe(exchange(tenant, 200))
    # Bounded: the least recently answered goes first.
    assert "a" not in answered and "b" in answered and "c" in answered


async def test_a_point_that_may_not_prepare_takes_what_is_ready_and_starts_nothing() -> None:
    summaries = PreparedSummaries(max_tokens=500, count=count)
    missed: list[str] = []
    summaries.missed = missed.append  # type: ignore[method-assign]
    model = Counted()
    point = NeverWaiting(summaries, "t", "s", model, may_prepare=False)
    result = await point.summarize(request(("a", "b")))
    assert result.prepared == "none_ready" and result.model == "ledger"
    assert missed == ["unanswered"] and summaries.queue.state("s") is None
    await summaries.queue.idle()
    assert model.calls == 0
    # Allowed, the same point prepares its range for the next one.
    await NeverWaiting(summaries, "t", "s", model).summarize(request(("a", "b")))
    await summaries.queue.idle()
    assert model.calls == 1
