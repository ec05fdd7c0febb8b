"""Compaction timed by the provider's prompt cache (``policies/prompt_cache.py``): obsolete
outputs deep in the prefix go when the cache has expired or when the rewrite pays; the trigger
compacts a cold session at its lower mark and leaves a prefix just written until the window
requires; without a cache (time-blind) nothing changes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from policies.pipeline import Checkpoint, Policy, PolicyOutcome, build_policy
from policies.prompt_cache import PromptCache, rewrite_pays
from tests.policies.test_superseded_reads import COUNTER, START, alone, notes, run_command, view_file, view_of

WARM = PromptCache(idle_seconds=20.0, ttl_seconds=300.0, read_price=0.5, write_price=1.0)
COLD = PromptCache(idle_seconds=900.0, ttl_seconds=300.0, read_price=0.5, write_price=1.0)
# Anthropic's prices: a cache read costs a tenth, a rewrite writes at 1.25x.
WARM_ANTHROPIC = PromptCache(idle_seconds=20.0, ttl_seconds=300.0, read_price=0.1, write_price=1.25)


def apply(policy: Policy, messages: list[Any], window: int = 128_000, **kwargs: Any) -> PolicyOutcome:
    body = {"model": "gpt-4o", "messages": messages}
    outcome: PolicyOutcome = asyncio.run(policy.apply(body, COUNTER, window=window, **kwargs))
    return outcome


def big_file(path: str, lines: int = 400) -> str:
    rows = (f"{n + 1:6}\tvalue_{n} = compute({n})  # {path} and some more text" for n in range(lines))
    return "\n".join(rows)


def session(steps_after: int) -> list[Any]:
    """A large read of a.py, ``steps_after`` small commands, then a.py read again (newest)."""
    messages = [*START, *view_file("c0", "/repo/a.py", big_file("/repo/a.py"))]
    for n in range(steps_after):
        messages += run_command(f"r{n}", f"echo step{n}", f"step{n} ok\n" * 40)
    return [*messages, *view_file("cz", "/repo/a.py", big_file("/repo/a.py", 50))]


def test_the_cache_is_cold_only_after_its_lifetime() -> None:
    assert not WARM.cold
    assert COLD.cold
    assert not PromptCache(idle_seconds=None, ttl_seconds=300.0).cold


def test_a_rewrite_pays_when_the_tokens_saved_ahead_cover_the_cache_lost() -> None:
    # 1,000 tokens saved on each of 10 requests at 0.5 = 5,000; rewriting 4,000 tokens loses 2,000.
    assert rewrite_pays(1000, 4000, 10, WARM, payback=2.0)
    assert not rewrite_pays(1000, 12_000, 10, WARM, payback=2.0)
    # At Anthropic's prices the same saving pays for far less: 1,000 x 0.1 x 10 = 1,000.
    assert not rewrite_pays(1000, 4000, 10, WARM_ANTHROPIC, payback=2.0)
    assert rewrite_pays(1000, 400, 10, WARM_ANTHROPIC, payback=2.0)
    assert rewrite_pays(1, 10**9, 1, COLD, payback=2.0)
    assert not rewrite_pays(0, 1, 10, COLD, payback=2.0)


def test_time_blind_a_deep_read_waits_for_a_point() -> None:
    messages = session(steps_after=20)
    assert notes(view_of(apply(alone(), messages), messages)) == {}


def test_a_cold_session_has_every_obsolete_output_rewritten() -> None:
    messages = session(steps_after=3)
    outcome = apply(alone(), messages, cache=COLD)
    assert set(notes(view_of(outcome, messages))) == {"c0"}
    assert outcome.facts.superseded_reads is not None
    assert outcome.facts.superseded_reads.rewrite == "cold"
    # Not a compaction point, but the provider writes the prefix anew: the trigger's grace.
    assert outcome.checkpoint.compactions == 0
    assert outcome.checkpoint.prefix_written_at == outcome.checkpoint.requests


def test_a_warm_prefix_is_rewritten_when_it_pays_and_only_then() -> None:
    # A large read early in a long session: saved on as many requests ahead as steps so far.
    long = session(steps_after=20)
    outcome = apply(alone(), long, cache=WARM)
    assert set(notes(view_of(outcome, long))) == {"c0"}
    assert outcome.facts.superseded_reads is not None
    assert outcome.facts.superseded_reads.rewrite == "paid"
    # At Anthropic's prices (reads at 0.1x, writes at 1.25x) the same rewrite does not pay.
    assert notes(view_of(apply(alone(), long, cache=WARM_ANTHROPIC), long)) == {}
    # Off: the stage keeps to the tail.
    off = build_policy("off", "", [{"superseded_reads": {"cache_aware": False}}], safeguard=False)
    assert notes(view_of(apply(off, long, cache=WARM), long)) == {}


def request_tokens(messages: list[Any]) -> int:
    """The whole request as the trigger weighs it (the view, the answer's reserve)."""
    fact = apply(trigger_policy(), messages, window=10**7).facts.trigger
    assert fact is not None
    return fact.request_tokens


def test_a_rewrite_does_not_pay_just_before_the_mark() -> None:
    """The requests ahead stop at the trigger's mark: a session about to compact is not
    rewritten (the point rewrites it anyway)."""
    messages = session(steps_after=20)
    policy = build_policy("p", "", [{"trigger": {"high": 0.75}}, {"superseded_reads": {}}], safeguard=False)
    tokens = request_tokens(messages)
    roomy = apply(policy, messages, window=tokens * 4, cache=WARM)
    assert set(notes(view_of(roomy, messages))) == {"c0"}
    near = apply(policy, messages, window=int(tokens / 0.75) + 40, cache=WARM)
    assert near.trigger is None
    assert notes(view_of(near, messages)) == {}


def trigger_policy(**knobs: Any) -> Policy:
    return build_policy("t", "", [{"trigger": {"high": 0.75, **knobs}}], safeguard=False)


def test_a_cold_session_is_compacted_from_the_lower_mark() -> None:
    messages = session(steps_after=10)
    tokens = request_tokens(messages)
    window = int(tokens / 0.7)  # the request is at 0.7 x window: under 0.75, over 0.6
    policy = trigger_policy(cold_high=0.6)
    assert apply(policy, messages, window=window, cache=WARM).trigger is None
    cold = apply(policy, messages, window=window, cache=COLD)
    assert cold.trigger == "threshold"
    assert cold.facts.trigger is not None and cold.facts.trigger.cold
    assert apply(trigger_policy(), messages, window=window, cache=COLD).trigger is None


def test_a_prefix_just_written_is_not_compacted_until_the_window_requires() -> None:
    messages = session(steps_after=10)
    tokens = request_tokens(messages)
    window = int(tokens / 0.8)  # over the 0.75 mark, well under the window
    policy = trigger_policy(write_grace=1)
    written = Checkpoint(requests=4, prefix_written_at=4)
    held = apply(policy, messages, window=window, checkpoint=written, cache=WARM)
    assert held.trigger is None
    # Two requests on, or time-blind, or with the cache expired: the mark holds again.
    later = Checkpoint(requests=5, prefix_written_at=4)
    assert apply(policy, messages, window=window, checkpoint=later, cache=WARM).trigger == "threshold"
    assert apply(policy, messages, window=window, checkpoint=written).trigger == "threshold"
    assert apply(policy, messages, window=window, checkpoint=written, cache=COLD).trigger == "threshold"
    # Over the window itself, it compacts.
    tight = int(tokens / 1.05)
    assert apply(policy, messages, window=tight, checkpoint=written, cache=WARM).trigger == "threshold"


@pytest.mark.parametrize("knobs", [{"cold_high": 0.9}, {"cold_high": 0.0}, {"write_grace": -1}])
def test_trigger_knobs_are_validated(knobs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        trigger_policy(**knobs)
