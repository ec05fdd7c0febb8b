"""Summaries prepared ahead: the checks before use, and the manager (pure asyncio, no HTTP)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from policies.ledger import LEDGER_HEADING, CommandRecord, FileRecord, Ledger
from policies.stages.common import summary_content
from policies.summarizer import SummaryRequest, SummaryResult
from proxy.summaries.prepared import NeverWaiting, PreparedSummaries
from proxy.summaries.prepared_checks import Prepared, check, lineage

LEDGER = Ledger(
    goal="Fix the parser in src/parser.py",
    files=(FileRecord(path="src/parser.py", views=2),),
    commands=(CommandRecord(command="pytest tests/test_parser.py", exit_code=1),),
    errors=("ValueError: bad token in parse_header",),
    handles=("out_0123456789abcdef",),
)


def request(digests: tuple[str, ...], start: int = 2) -> SummaryRequest:
    return SummaryRequest(
        previous_summary=None,
        messages=[],
        ledger=LEDGER,
        covered=(start, start + len(digests)),
        covered_digests=digests,
    )


def prepared(text: str, digests: tuple[str, ...] = ("a", "b"), start: int = 2) -> Prepared:
    return Prepared(start, digests, SummaryResult(text=text, model="m", prompt_family="hybrid_v2"), 0.0)


def count(text: str) -> int:
    return len(text.split())


def test_a_summary_of_a_prefix_of_the_range_passes() -> None:
    text = (
        "The agent read src/parser.py, ran pytest and saw ValueError in parse_header (out_0123456789abcdef)."
    )
    assert check(prepared(text), request(("a", "b", "c", "d")), 500, count) is None


def test_a_changed_or_branched_conversation_makes_it_stale() -> None:
    assert check(prepared("ok"), request(("a", "X", "c")), 500, count) == "stale"
    assert check(prepared("ok"), request(("a", "b", "c"), start=4), 500, count) == "stale"
    assert check(prepared("ok", ("a", "b", "c")), request(("a", "b")), 500, count) == "stale"


def summary(narrative: str, ledger: str = "- messages 2-9: handle=out_5d30d24b6338da4f") -> str:
    """A summary message's content: the model's narrative, then the ledger."""
    return summary_content(narrative, f"{LEDGER_HEADING}\n{ledger}")


def test_a_summary_written_before_the_current_narrative_is_stale() -> None:
    """Prepared for an earlier point (another replica's, landing late): it would put an older
    narrative in place of the one the summary has now. One written on the same narrative passes,
    also when a ledger-only point kept that narrative in between."""
    text = "The agent ran pytest on src/parser.py."
    now = replace(request(("a", "b", "c")), previous_summary=summary("The agent read src/parser.py."))
    assert check(prepared(text), now, 500, count) == "stale"
    on_it = replace(prepared(text), built_on=lineage(summary("The agent read src/parser.py.", "- other")))
    assert check(on_it, now, 500, count) is None
    assert lineage(summary("")) == lineage(None) == ""


def test_what_the_ledger_does_not_know_or_spells_otherwise_is_rejected() -> None:
    digests = ("a", "b", "c")
    handle = check(prepared("Read out_fedcba9876543210 for details."), request(digests), 500, count)
    assert handle == "rejected: names handle out_fedcba9876543210, which the ledger does not know"
    file = check(prepared("The fix is in src/lexer.py."), request(digests), 500, count)
    assert file == "rejected: names file src/lexer.py, which the ledger does not know"
    spelled = check(prepared("The error came from Parse_Header."), request(digests), 500, count)
    assert spelled == "rejected: spells parse_header as Parse_Header"
    assert check(prepared("word " * 600), request(digests), 500, count) == "rejected: over the summary budget"


class SlowSummarizer:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.calls = 0

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.calls += 1
        await asyncio.sleep(self.seconds)
        return SummaryResult(
            text="The agent ran pytest on src/parser.py.", model="slow", prompt_family="hybrid_v2"
        )


async def test_a_point_never_waits_and_the_next_uses_what_was_prepared() -> None:
    results: list[str] = []
    summaries = PreparedSummaries(max_tokens=500, count=count, counted=results.append)
    model = SlowSummarizer(0.3)
    point = NeverWaiting(summaries, "t", "s", model)
    started = asyncio.get_running_loop().time()
    first = await point.summarize(request(("a", "b")))
    assert asyncio.get_running_loop().time() - started < 0.05
    assert first.model == "ledger" and first.prepared == "none_ready" and summaries.running("s")
    await summaries.queue.idle()
    second = await point.summarize(request(("a", "b", "c", "d")))
    assert second.model == "slow" and second.prepared == "used" and second.text.startswith("The agent")
    assert results == ["none_ready", "prepared", "used"] and model.calls == 1


async def test_a_replay_point_settles_the_preparation_in_flight() -> None:
    """With ``X-Compaction-Prepared: wait`` (the replay's header) a point takes what its
    preparation makes, however fast the requests come: the same decisions every run."""
    results: list[str] = []
    summaries = PreparedSummaries(max_tokens=500, count=count, counted=results.append)
    model = SlowSummarizer(0.2)
    summaries.start("t", "s", request(("a", "b")), model)
    waiting = NeverWaiting(summaries, "t", "s", model, wait=True)
    used = await waiting.summarize(request(("a", "b", "c")))
    assert used.prepared == "used" and used.model == "slow"
