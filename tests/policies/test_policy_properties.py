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
from proxy.config.settings import Settings, policy_specs
from tests.policies.conversations import conversation, with_instructions

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


def instructions_inside(messages: list[Any]) -> list[Any]:
    """The system/developer messages after the leading ones: the fixed part inside the history."""
    return [m for m in messages[parse(messages).prefix_end :] if role(m) in ("system", "developer")]


@pytest.mark.parametrize("name", sorted(POLICIES))
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(messages=with_instructions(conversation()))
def test_instructions_inside_the_history_stay_verbatim_in_order(name: str, messages: list[Any]) -> None:
    """A system or developer message inside the history (Claude Code's environment block for a
    model it does not know, a developer note) is part of the fixed part: every view holds it,
    the client's own object, in its order; never summarized, offloaded or cut."""
    inside = instructions_inside(messages)
    assert inside
    for window in WINDOWS[:2]:
        outcome = run(POLICIES[name], messages, window)
        view = outcome.messages if outcome.messages is not None else messages
        check_view(messages, view)
        assert [m for m in view if any(m is i for i in inside)] == inside, (name, window, shape(view))


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(messages=with_instructions(conversation()))
def test_instructions_inside_the_history_survive_request_by_request(messages: list[Any]) -> None:
    """Carried from one request to the next in a checkpoint, the summary keeps them too."""
    for name in ("improved", "sre", "n_latest_10"):
        checkpoint = None
        for end in [i + 1 for i, m in enumerate(messages) if role(m) in ("tool", "user", "system")]:
            history = messages[:end]
            outcome = run(POLICIES[name], history, 4_000, checkpoint)
            view = outcome.messages if outcome.messages is not None else history
            check_view(history, view)
            inside = instructions_inside(history)
            assert [m for m in view if any(m is i for i in inside)] == inside, (name, end, shape(view))
            checkpoint = outcome.checkpoint


def test_a_summary_made_before_the_agent_read_as_text_actions_is_made_again() -> None:
    """After one text action the conversation reads as a chat (the observation is the last
    user message, and sre summarizes the task with the action); a second action shows an agent
    whose user messages are observations, so the task is the last real question again. The
    checkpoint that summarized it is dropped, and the task is sent verbatim (found by
    hypothesis)."""
    action = "Writing it.\n<function=str_replace_editor>\n<parameter=file_text>\n" + "x = 1\n" * 1300
    messages: list[Any] = [
        {"role": "system", "content": "error"},
        {"role": "user", "content": [{"type": "text", "text": "error"}]},
        {"role": "assistant", "content": action + "</parameter>\n</function>"},
        {"role": "user", "content": [{"type": "text", "text": "error"}]},
        {
            "role": "assistant",
            "content": "Next.\n<function=bash>\n<parameter=command>ls</parameter>\n</function>",
        },
        {"role": "user", "content": [{"type": "text", "text": "error"}]},
    ]
    first = run(POLICIES["sre"], messages[:4], 4_000)
    assert first.checkpoint.summary is not None and first.checkpoint.summary_at == 1
    later = run(POLICIES["sre"], messages, 4_000, first.checkpoint)
    view = later.messages if later.messages is not None else messages
    check_view(messages, view)
    assert later.facts.checkpoint_dropped == "the summarized range holds the last user message"
