"""Every shipped policy, over generated conversations: protocol-safe, order-preserving,
keeps the system prompt and the last user message verbatim, never grows, deterministic."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from policies.conversation import parse, role
from policies.pipeline import Checkpoint, Policy, build_policies
from policies.tokens import TokenCounter
from proxy.settings import Settings, policy_specs
from tests.policies.conversations import conversation

COUNTER = TokenCounter()
POLICIES = build_policies(policy_specs(Settings()))
WINDOWS = (2_048, 6_000, 128_000)


def run(policy: Policy, messages: list[Any], window: int, checkpoint: Checkpoint | None = None) -> Any:
    return asyncio.run(
        policy.apply({"model": "gpt-4o", "messages": messages}, COUNTER, window=window, checkpoint=checkpoint)
    )


def shape(messages: list[Any]) -> str:
    return " ".join(f"{m.get('role', '?')[0]}{len(str(m.get('content')))}" for m in messages)


def check_view(original: list[Any], view: list[Any]) -> None:
    assert parse(view).problems == (), (parse(view).problems, shape(original), shape(view))
    conv = parse(original)
    for index in range(conv.prefix_end):
        assert view[index] is original[index]
    if conv.last_user >= 0:
        assert any(m is original[conv.last_user] for m in view), (
            f"last user message {conv.last_user} lost: {shape(original)} -> {shape(view)}"
        )
    # Order preserved: messages taken from the input keep their relative order.
    positions = {id(m): i for i, m in enumerate(original)}
    taken = [positions[id(m)] for m in view if id(m) in positions]
    assert taken == sorted(taken)


@pytest.mark.parametrize("name", sorted(POLICIES))
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(messages=conversation())
def test_policy_properties(name: str, messages: list[Any]) -> None:
    policy = POLICIES[name]
    for window in WINDOWS:
        outcome = run(policy, messages, window)
        view = outcome.messages if outcome.messages is not None else messages
        try:
            check_view(messages, view)
        except AssertionError as error:
            raise AssertionError(
                f"{name} window={window} {outcome.mechanisms} {outcome.facts}: {error}"
            ) from None
        assert outcome.tokens_after <= outcome.tokens_before
        again = run(policy, messages, window)
        assert again.messages == outcome.messages
        assert again.tokens_after == outcome.tokens_after


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(messages=conversation())
def test_request_by_request_with_checkpoints(messages: list[Any]) -> None:
    """Replaying a session request by request, carrying the checkpoint, stays protocol-safe."""
    for name in ("sre", "n_latest_10"):
        checkpoint = None
        cuts = [i + 1 for i, m in enumerate(messages) if role(m) in ("tool", "user")]
        for end in cuts:
            history = messages[:end]
            outcome = run(POLICIES[name], history, 4_000, checkpoint)
            view = outcome.messages if outcome.messages is not None else history
            check_view(history, view)
            checkpoint = outcome.checkpoint
