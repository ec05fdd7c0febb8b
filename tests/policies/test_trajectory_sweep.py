"""Every shipped policy over every sample trajectory, request by request (the history up to
each assistant turn is one request), carrying the session checkpoint: never a protocol
violation, never more tokens than the request, the system prompt and task kept."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from policies.conversation import parse, role
from policies.pipeline import build_policies
from policies.prompt_cache import PromptCache
from policies.tokens import TokenCounter
from proxy.config.settings import Settings, policy_specs
from replay.recording.rows import iter_rows, row_messages, row_tools
from tests.policies.conversations import tail_start

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "tests" / "fixtures" / "sample_trajectories.jsonl"  # the 68 sample rows
FIXTURE = ROOT / "tests" / "fixtures" / "trajectories_sample.jsonl"
DATA = SAMPLE if SAMPLE.exists() else FIXTURE
ROWS = list(iter_rows(DATA))
COUNTER = TokenCounter()
POLICIES = build_policies(policy_specs(Settings()))
# The ablation arms have no tail_offload stage.
ABLATION = {"improved_tail", "improved_step", "improved_offload", "improved_retry"}


def requests_of(messages: list[Any]) -> list[list[Any]]:
    """Each request is the history before an assistant message."""
    return [messages[:i] for i, m in enumerate(messages) if role(m) == "assistant" and i > 0]


@pytest.mark.parametrize("window", [8_192, 32_000])
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_policy_over_every_trajectory(name: str, window: int) -> None:
    policy = POLICIES[name]
    requests = violations = compactions = 0
    before_total = after_total = 0
    unstable: list[str] = []
    # Between points, changes of the previous view's tail, by the stage that made them.
    tail_changes = {"tail_offload": 0, "superseded_reads": 0}

    async def replay() -> None:
        nonlocal requests, violations, compactions, before_total, after_total
        for row in ROWS:
            messages, tools = row_messages(row), row_tools(row)
            checkpoint = None
            previous: list[Any] | None = None
            for history in requests_of(messages):
                body = {"model": "gpt-4o", "messages": history, "tools": tools}
                outcome = await policy.apply(body, COUNTER, window=window, checkpoint=checkpoint)
                checkpoint = outcome.checkpoint
                view = outcome.messages if outcome.messages is not None else history
                problems = parse(view).problems
                violations += len(problems)
                assert not problems, (row["instance_id"], problems)
                assert view[0] is history[0]
                assert outcome.tokens_after <= outcome.tokens_before
                if previous is not None and outcome.trigger is None and view[: len(previous)] != previous:
                    # Between points only the previous view's tail (its newest step with output) may
                    # change (an output put behind its handle in a tight session, or one the newest
                    # step made obsolete): the prefix before it stays.
                    final = tail_start(previous)
                    changed_by = [m for m in tail_changes if m in outcome.mechanisms]
                    if view[:final] == previous[:final] and changed_by:
                        for mechanism in changed_by:
                            tail_changes[mechanism] += 1
                    else:
                        unstable.append(f"{row['instance_id']}@{len(history)}")
                previous = view
                requests += 1
                before_total += outcome.tokens_before
                after_total += outcome.tokens_after
            compactions += checkpoint.compactions if checkpoint else 0

    asyncio.run(replay())
    assert requests > 0 and violations == 0
    if name == "full" or name.startswith("improved"):
        # Cache stability: between compaction points the prefix the upstream sees only grows,
        # but for the previous view's final step in a tight session.
        assert unstable == []
    if not name.startswith("improved") or name in ABLATION or window > 8_192:
        assert tail_changes["tail_offload"] == 0
    if name not in ("improved",):
        assert tail_changes["superseded_reads"] == 0
    else:
        # A file read again (or a command run again) in the next step: the tail's output goes.
        assert tail_changes["superseded_reads"] > 0
    if name == "full":
        assert after_total == before_total


WARM = PromptCache(idle_seconds=20.0, ttl_seconds=300.0, read_price=0.5, write_price=1.0)
COLD = PromptCache(idle_seconds=900.0, ttl_seconds=300.0, read_price=0.5, write_price=1.0)


@pytest.mark.parametrize("window", [8_192, 32_000, 128_000])
def test_improved_timed_by_the_cache_over_every_trajectory(window: int) -> None:
    """``improved`` with the provider's cache known (warm, expired before every fifth request):
    never a protocol violation nor more tokens than the request, and between points a change
    before the previous view's tail is only a rewrite the stage says paid or came after expiry;
    some do happen."""
    policy = POLICIES["improved"]
    deeper = {"paid": 0, "cold": 0}

    async def replay() -> None:
        for row in ROWS:
            messages, tools = row_messages(row), row_tools(row)
            checkpoint = None
            previous: list[Any] | None = None
            for number, history in enumerate(requests_of(messages)):
                body = {"model": "gpt-4o", "messages": history, "tools": tools}
                cache = COLD if number % 5 == 4 else WARM
                outcome = await policy.apply(body, COUNTER, window=window, checkpoint=checkpoint, cache=cache)
                checkpoint = outcome.checkpoint
                view = outcome.messages if outcome.messages is not None else history
                assert not parse(view).problems, row["instance_id"]
                assert outcome.tokens_after <= outcome.tokens_before
                if previous is not None and outcome.trigger is None:
                    final = tail_start(previous)
                    if view[:final] != previous[:final]:
                        fact = outcome.facts.superseded_reads
                        assert fact is not None and fact.rewrite in deeper, row["instance_id"]
                        deeper[fact.rewrite] += 1
                previous = view

    asyncio.run(replay())
    assert deeper["cold"] > 0
    if window > 8_192:
        assert deeper["paid"] > 0
