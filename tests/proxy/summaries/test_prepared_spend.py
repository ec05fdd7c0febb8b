"""The preparations' tokens are the compaction's own cost: counted by source and canary arm
when spent (used or not), and recorded at once with whose they are (their own event, the
canary book), each preparation once."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import CollectorRegistry

from policies.summarizer import SummaryRequest, SummaryResult
from policies.tokens import TokenCounter
from proxy.config.settings import load_settings
from proxy.summaries.prepared import NeverWaiting
from proxy.summaries.prepared_setup import make_prepared
from proxy.telemetry.compaction_cost import Preparation, Preparations, PreparedFor
from proxy.telemetry.metrics import Metrics
from tests.proxy.summaries.test_prepared import request


class Paid:
    """A summarizer that reports the tokens a model would bill."""

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        return SummaryResult(
            text="The agent ran pytest on src/parser.py.",
            model="small",
            prompt_family="hybrid_v2",
            input_tokens=800,
            output_tokens=90,
        )


async def test_a_preparation_is_paid_under_its_session_and_arm_used_or_not(tmp_path: Path) -> None:
    settings = load_settings(
        env={},
        overrides={"state_dir": str(tmp_path), "summarizer.kind": "openai", "summarizer.prepare_at": 0.5},
    )
    registry = CollectorRegistry()
    preparations, done = Preparations(), []
    preparations.listeners.append(done.append)
    summaries = make_prepared(settings, TokenCounter(), Metrics(registry), None, preparations)
    assert summaries is not None
    whose = PreparedFor(arm="treated", canary_key="t\x1fk", policy="improved")
    point = NeverWaiting(summaries, "t", "s_1:improved", Paid(), whose=whose)
    await point.summarize(request(("a", "b")))  # nothing ready: this range is prepared
    await summaries.queue.idle()
    # Prepared again for a newer range (the first one never used): both are paid.
    summaries.start("t", "s_1:improved", request(("a", "b", "c")), Paid(), whose)
    await summaries.queue.idle()

    def tokens(kind: str, source: str, arm: str) -> float | None:
        labels = {"kind": kind, "source": source, "arm": arm}
        return registry.get_sample_value("compaction_proxy_compaction_tokens_total", labels)

    assert tokens("input", "preparation", "treated") == 1600
    assert tokens("output", "preparation", "treated") == 180
    assert (
        registry.get_sample_value("compaction_proxy_prepared_summary_tokens_total", {"kind": "input"}) == 1600
    )
    # Each recorded once, as it finished, with its tenant, session and whose it is.
    assert done == [Preparation("t", "s_1:improved", whose, 800, 90)] * 2


async def test_settle_all_waits_for_every_policy_of_the_session_and_no_other(tmp_path: Path) -> None:
    settings = load_settings(
        env={},
        overrides={"state_dir": str(tmp_path), "summarizer.kind": "openai", "summarizer.prepare_at": 0.5},
    )
    preparations, done = Preparations(), []
    preparations.listeners.append(done.append)
    summaries = make_prepared(settings, TokenCounter(), Metrics(CollectorRegistry()), None, preparations)
    assert summaries is not None
    release = asyncio.Event()

    class Held(Paid):
        async def summarize(self, request: SummaryRequest) -> SummaryResult:
            await release.wait()
            return await super().summarize(request)

    for session in ("s_1:improved", "s_1:full", "s_10:improved"):
        summaries.start("t", session, request(("a", "b")), Held())
    settled = asyncio.ensure_future(summaries.settle_all("s_1"))
    await asyncio.sleep(0)
    assert not settled.done()  # its preparations are still running
    release.set()
    await settled
    assert {d.session for d in done} >= {"s_1:improved", "s_1:full"}
    await summaries.queue.idle()
