"""The policies that offload edits, over generated sessions with large edit arguments, request
by request with the session checkpoint: every call in a view is still the client's call (same
id, same name, a JSON object of arguments where the client sent one, answered by its result),
every handle a view names was saved at or before that request, and between compaction points
the view only grows."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings

from policies.conversation import role
from policies.handles import PATTERN
from policies.pipeline import Checkpoint, PolicyOutcome, build_policies
from policies.tokens import TokenCounter
from proxy.config.settings import Settings, policy_specs
from tests.policies.conversations import conversation, tail_start
from tests.policies.test_policy_properties import check_view

COUNTER = TokenCounter()
POLICIES = build_policies(policy_specs(Settings()))


def calls_of(messages: list[Any]) -> list[dict[str, Any]]:
    return [c for m in messages if role(m) == "assistant" for c in m.get("tool_calls") or []]


def check_calls(original: list[Any], view: list[Any]) -> None:
    sent = {c["id"]: c for c in calls_of(original)}
    for call in calls_of(view):
        client = sent[call["id"]]
        assert call["function"]["name"] == client["function"]["name"]
        if call["function"]["arguments"] != client["function"]["arguments"]:
            rewritten = orjson.loads(call["function"]["arguments"])
            assert isinstance(rewritten, dict)
            assert list(rewritten) == list(orjson.loads(client["function"]["arguments"]))


def named_handles(view: list[Any]) -> set[str]:
    return set(PATTERN.findall(orjson.dumps(view).decode()))


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(messages=conversation())
def test_offloaded_edits_stay_protocol_valid_request_by_request(messages: list[Any]) -> None:
    for name in ("improved", "improved_offload", "improved_no_superseded"):
        for window in (2_048, 6_000):
            checkpoint: Checkpoint | None = None
            saved: set[str] = set()
            previous: list[Any] | None = None
            for end in [i + 1 for i, m in enumerate(messages) if role(m) in ("tool", "user")]:
                history = messages[:end]
                outcome: PolicyOutcome = asyncio.run(
                    POLICIES[name].apply(
                        {"model": "gpt-4o", "messages": history},
                        COUNTER,
                        window=window,
                        checkpoint=checkpoint,
                    )
                )
                view = outcome.messages if outcome.messages is not None else history
                check_view(history, view)
                check_calls(history, view)
                saved |= set(outcome.offloads)
                missing = named_handles(view) - saved - set(PATTERN.findall(orjson.dumps(history).decode()))
                assert not missing, f"{name}@{window}: named before saved: {missing}"
                if previous is not None and outcome.trigger is None and view[: len(previous)] != previous:
                    # Between points only the previous view's tail (its newest step with output) may
                    # change, by tail_offload in a tight session or superseded_reads (an output the
                    # newest step made obsolete): the prefix before it stays.
                    final = tail_start(previous)
                    assert view[:final] == previous[:final], f"{name}@{window}: prefix changed at {end}"
                    assert {"tail_offload", "superseded_reads"} & set(outcome.mechanisms), (
                        f"{name}@{window}: changed at {end}"
                    )
                previous, checkpoint = view, outcome.checkpoint
