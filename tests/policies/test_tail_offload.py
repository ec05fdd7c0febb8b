"""The steady state at tight windows (``tail_offload``): once a point finds the fixed part takes
its target, outputs go behind their handles as soon as they are no longer the newest, only the
previous request's tail changes between points, and a point buys many steps."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

from policies.conversation import parse
from policies.digests import Digests
from policies.handles import is_placeholder
from policies.pipeline import Checkpoint, PolicyOutcome, View, apply_checkpoint, build_policies
from policies.tokens import TokenCounter
from proxy.config.settings import Settings, policy_specs
from tests.policies.conversations import tail_start

COUNTER = TokenCounter()
POLICIES = build_policies(policy_specs(Settings()))
ENCODING = "o200k_base"


def fixed_prompt(tokens: int) -> str:
    """A system prompt of about ``tokens`` tokens (rules an agent's prompt would hold)."""
    lines, text = [], ""
    while COUNTER.count_text(text, ENCODING) < tokens:
        n = len(lines)
        lines.append(f"* Rule {n}: keep change {n} minimal, run the tests of module_{n % 17} after it.")
        text = "\n".join(lines)
    return text


def step(index: int, tokens: int) -> list[dict[str, Any]]:
    """One agent step: a shell call and its output of about ``tokens`` tokens."""
    call_id = f"call_{index}"
    command = f"cat -n src/module_{index}.py"
    lines, text = [], ""
    while COUNTER.count_text(text, ENCODING) < tokens:
        n = len(lines)
        lines.append(f"{n + 1:6}\tdef handler_{index}_{n}(value):  # step {index} line {n}")
        text = "\n".join(lines)
    arguments = json.dumps({"command": command})
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "execute_bash", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": text},
    ]


Results = list[tuple[list[Any], PolicyOutcome]]


def session(window: int, fixed: int, steps: int, step_tokens: int = 1100) -> Results:
    """Each request of an agent session through ``improved``, the checkpoint carried: the
    agent sends its whole history every time; (view, outcome) per request."""
    history: list[dict[str, Any]] = [
        {"role": "system", "content": fixed_prompt(fixed)},
        {"role": "user", "content": "Fix the failing test in module_3 and report what you changed."},
    ]
    checkpoint: Checkpoint | None = None
    results = []
    for index in range(steps):
        history = [*history, *step(index, step_tokens)]
        body = {"model": "gpt-4o", "messages": history}
        outcome = asyncio.run(POLICIES["improved"].apply(body, COUNTER, window=window, checkpoint=checkpoint))
        checkpoint = outcome.checkpoint
        results.append((outcome.messages if outcome.messages is not None else history, outcome))
    return results


def test_a_tight_session_changes_only_the_previous_tail_between_points() -> None:
    results = session(8_192, 2_800, 60)
    points = [i for i, (_, outcome) in enumerate(results) if outcome.trigger]
    # A point at most every 4th request (it was almost every request before tail_offload).
    assert 0 < len(points) <= len(results) // 4, points
    tails = 0
    for (previous, _), (view, outcome) in itertools.pairwise(results):
        assert parse(view).problems == ()
        assert outcome.tokens_after + 1024 <= 8_192
        if outcome.trigger or view[: len(previous)] == previous:
            continue
        # Not a point, not an append: only the previous view's tail changed, in place.
        start = tail_start(previous)
        assert view[:start] == previous[:start]
        assert outcome.mechanisms == ("checkpoint", "tail_offload") or outcome.mechanisms == ("tail_offload",)
        assert outcome.facts.tail_offload is not None and outcome.facts.tail_offload.outputs == 1
        assert is_placeholder(view[start + 1]["content"])
        tails += 1
    assert tails > 30


def test_the_placeholder_put_at_the_tail_is_sent_byte_for_byte_later() -> None:
    results = session(8_192, 2_800, 24)
    seen: dict[str, dict[str, Any]] = {}
    for view, _ in results:
        for message in view:
            if message.get("role") == "tool" and is_placeholder(message["content"]):
                earlier = seen.setdefault(message["tool_call_id"], message)
                assert earlier == message


def test_a_point_is_not_counted_for_a_tail_change() -> None:
    results = session(8_192, 2_800, 30)
    compactions = [outcome.checkpoint.compactions for _, outcome in results]
    points = sum(1 for _, outcome in results if outcome.trigger)
    assert compactions[-1] == points


def test_at_16k_with_a_fixed_part_of_45_percent_a_point_buys_many_steps() -> None:
    results = session(16_384, int(0.45 * 16_384), 60)
    points = [i for i, (_, outcome) in enumerate(results) if outcome.trigger]
    # A point every 8th request at most (without tail_offload: 14 points in 60 requests).
    assert 0 < len(points) <= len(results) // 8, points
    assert all(outcome.tokens_after + 1024 <= 16_384 for _, outcome in results)


def test_a_roomy_window_keeps_every_output_between_points() -> None:
    """With room (a 32k window, a small fixed part), a point lands under its target: nothing is
    tight, and between points the view only grows."""
    results = session(32_000, 1_500, 60)
    assert any(outcome.trigger for _, outcome in results)
    for (previous, _), (view, outcome) in itertools.pairwise(results):
        assert "tail_offload" not in outcome.mechanisms
        if not outcome.trigger:
            assert view[: len(previous)] == previous
    assert not any(outcome.checkpoint.tight for _, outcome in results)


def test_one_huge_newest_output_does_not_make_a_session_tight() -> None:
    """A point that misses its target because of its final step alone (a 70k output at 128k)
    leaves the session roomy: later outputs stay verbatim."""
    history: list[dict[str, Any]] = [
        {"role": "system", "content": fixed_prompt(1_000)},
        {"role": "user", "content": "Fix the failing test."},
    ]
    for index in range(40):
        history += step(index, 1_800)
    history += step(40, 70_000)
    body = {"model": "gpt-4o", "messages": history}
    outcome = asyncio.run(POLICIES["improved"].apply(body, COUNTER, window=128_000))
    assert outcome.trigger and outcome.checkpoint.short_of_target
    assert not outcome.checkpoint.tight
    history += step(41, 1_000)
    later = asyncio.run(
        POLICIES["improved"].apply(
            {"model": "gpt-4o", "messages": history}, COUNTER, window=128_000, checkpoint=outcome.checkpoint
        )
    )
    assert "tail_offload" not in later.mechanisms


def test_the_checkpoint_rebuilds_a_view_with_a_tail_change() -> None:
    """An event between points carries the checkpoint only: with the client's history, it
    rebuilds the exact view, the tail's new placeholder included."""
    history: list[dict[str, Any]] = [
        {"role": "system", "content": fixed_prompt(2_800)},
        {"role": "user", "content": "Fix the failing test in module_3 and report what you changed."},
    ]
    checkpoint: Checkpoint | None = None
    rebuilt = 0
    for index in range(20):
        history = [*history, *step(index, 1_100)]
        body = {"model": "gpt-4o", "messages": history}
        outcome = asyncio.run(POLICIES["improved"].apply(body, COUNTER, window=8_192, checkpoint=checkpoint))
        checkpoint = outcome.checkpoint
        if "tail_offload" in outcome.mechanisms and not outcome.trigger:
            origin = list(range(len(history)))
            view = View(messages=list(history), original=history, origin=origin, checkpoint=checkpoint)
            apply_checkpoint(view, Digests())
            assert view.messages == outcome.messages
            rebuilt += 1
    assert rebuilt > 5
