"""``superseded_reads`` over generated conversations, request by request with the checkpoint
carried: the tool-call protocol holds (a result stays, only its content changes), between
points only the previous request's tail changes, every note names a handle saved with the
output's own text, a note once sent is sent again byte for byte, and the same request gives the
same view; as shipped (``improved``) and with ``stale_newest``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, Phase, find, given, settings

from policies.conversation import message_text, parse, role
from policies.handles import PATTERN, superseded_of
from policies.pipeline import Checkpoint, Policy, PolicyOutcome, build_policy
from policies.prompt_cache import PromptCache
from policies.stages.step_outputs import recent_steps
from policies.tokens import TokenCounter
from proxy.config.settings import Settings, policy_specs
from tests.policies.conversations import conversation, tail_start, with_instructions
from tests.policies.test_policy_properties import check_view

COUNTER = TokenCounter()
SPECS = policy_specs(Settings())


def variant(name: str, min_chars: int, stale_newest: bool = False) -> Policy:
    """``improved`` with other knobs of its superseded_reads stage."""
    description, stages, safeguard, tools, patterns = SPECS["improved"]
    knobs = {"min_chars": min_chars, "commands": True, "stale_newest": stale_newest}
    changed = [{"superseded_reads": knobs} if "superseded_reads" in s else s for s in stages]
    return build_policy(name, description, changed, safeguard, tools, patterns)


POLICIES = (variant("improved", 300), variant("stale_newest", 300, stale_newest=True))
SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


def run(
    policy: Policy,
    messages: list[Any],
    window: int,
    checkpoint: Checkpoint | None,
    cache: PromptCache | None = None,
) -> PolicyOutcome:
    body = {"model": "gpt-4o", "messages": messages}
    return asyncio.run(policy.apply(body, COUNTER, window=window, checkpoint=checkpoint, cache=cache))


def requests(messages: list[Any]) -> list[list[Any]]:
    return [messages[: i + 1] for i, m in enumerate(messages) if role(m) in ("tool", "user")]


def check_results(history: list[Any], view: list[Any]) -> None:
    """A tool result in the view is the client's, or the client's with other content: same
    role, same call id, every other field as sent."""
    by_id = {m.get("tool_call_id"): m for m in history if role(m) == "tool"}
    for message in view:
        if role(message) == "tool":
            original = by_id[message.get("tool_call_id")]
            assert {k: v for k, v in message.items() if k != "content"} == {
                k: v for k, v in original.items() if k != "content"
            }


def session(
    policy: Policy, messages: list[Any], window: int, timed: bool = False
) -> Iterator[tuple[list[Any], PolicyOutcome]]:
    """(view, outcome) of each request of the session, the checkpoint carried; ``timed``: the
    provider's cache warm, and expired before every third request."""
    checkpoint: Checkpoint | None = None
    for number, history in enumerate(requests(messages)):
        cache = (COLD if number % 3 == 2 else WARM) if timed else None
        outcome = run(policy, history, window, checkpoint, cache)
        yield (outcome.messages if outcome.messages is not None else history, outcome)
        checkpoint = outcome.checkpoint


@SETTINGS
@given(messages=conversation())
def test_request_by_request_the_protocol_holds_and_only_the_tail_changes_between_points(
    messages: list[Any],
) -> None:
    for policy in POLICIES:
        for window in (2_048, 6_000, 128_000):
            saved: dict[str, str] = {}
            notes: dict[int, dict[str, Any]] = {}
            previous: list[Any] | None = None
            results = session(policy, messages, window)
            for history, (view, outcome) in zip(requests(messages), results, strict=True):
                where = f"{policy.name}@{window}, {len(history)} messages"
                check_view(history, view)
                check_results(history, view)
                assert outcome.tokens_after <= outcome.tokens_before, where
                saved |= {h: o.content for h, o in outcome.offloads.items()}
                named = set(PATTERN.findall(orjson.dumps(view).decode()))
                assert named <= set(saved) | set(PATTERN.findall(orjson.dumps(history).decode())), where
                origin = outcome.origin or tuple(range(len(view)))
                for message, source in zip(view, origin, strict=True):
                    note = superseded_of(message_text(message)) if role(message) in ("tool", "user") else None
                    if note is None:
                        continue
                    # The handle holds the output the note stands for (after a retry note, if any);
                    # a note is sent byte for byte.
                    assert message_text(history[source]) in saved[note[0]], where
                    assert notes.setdefault(source, message) == message, where
                if previous is not None and outcome.trigger is None and view[: len(previous)] != previous:
                    final = tail_start(previous)
                    assert view[:final] == previous[:final], f"{where}: the prefix changed"
                    assert {"tail_offload", "superseded_reads"} & set(outcome.mechanisms), where
                previous = view


WARM = PromptCache(idle_seconds=20.0, ttl_seconds=300.0, read_price=0.5, write_price=1.0)
COLD = PromptCache(idle_seconds=900.0, ttl_seconds=300.0, read_price=0.5, write_price=1.0)


@SETTINGS
@given(messages=conversation())
def test_timed_by_the_cache_the_protocol_holds_and_a_deeper_change_is_one_that_pays(
    messages: list[Any],
) -> None:
    """With the cache known (warm, expired before every third request), every view is
    protocol-valid, every note's handle holds its output, and between points the prefix before
    the previous tail changes only by a rewrite the stage says paid or came after expiry."""
    policy = POLICIES[0]
    for window in (2_048, 6_000, 128_000):
        saved: dict[str, str] = {}
        previous: list[Any] | None = None
        for history, (view, outcome) in zip(
            requests(messages), session(policy, messages, window, True), strict=True
        ):
            where = f"timed {policy.name}@{window}, {len(history)} messages"
            check_view(history, view)
            check_results(history, view)
            saved |= {h: o.content for h, o in outcome.offloads.items()}
            named = set(PATTERN.findall(orjson.dumps(view).decode()))
            assert named <= set(saved) | set(PATTERN.findall(orjson.dumps(history).decode())), where
            if previous is not None and outcome.trigger is None and view[: len(previous)] != previous:
                final = tail_start(previous)
                if view[:final] != previous[:final]:
                    fact = outcome.facts.superseded_reads
                    assert fact is not None and fact.rewrite in ("paid", "cold"), where
            previous = view


@SETTINGS
@given(messages=with_instructions(conversation()))
def test_the_steps_found_from_the_end_are_the_whole_parses_steps(messages: list[Any]) -> None:
    """Between points the stage parses only the history from the previous request's tail on:
    the same steps as the whole history's parse from there, at every request."""
    for history in requests(messages):
        recent = recent_steps(history)
        if recent is None:
            continue
        whole = parse(history).steps
        assert recent[0].start in {s.start for s in whole}
        assert recent == tuple(s for s in whole if s.start >= recent[0].start)


@SETTINGS
@given(messages=conversation())
def test_the_same_request_gives_the_same_view(messages: list[Any]) -> None:
    for policy in POLICIES:
        for window in (2_048, 128_000):
            first = run(policy, messages, window, None)
            again = run(policy, messages, window, None)
            assert first.messages == again.messages
            assert first.checkpoint == again.checkpoint
            assert set(first.offloads) == set(again.offloads)


def fired(messages: list[Any], *, at_point: bool) -> bool:
    """Whether the stage replaced an output between points (or at a point) of this session."""
    return any(
        outcome.facts.superseded_reads is not None and bool(outcome.trigger) == at_point
        for _, outcome in session(POLICIES[0], messages, 6_000)
    )


# ``find`` shows the example it found: a long conversation, a long repr.
@pytest.mark.filterwarnings("ignore:Generating overly large repr")
def test_the_generated_conversations_reach_the_stage_between_and_at_points() -> None:
    """The properties above are not vacuous: generated sessions have outputs the stage replaces
    between points (a read or a command again in the next step) and at compaction points, for
    tool-calling agents and for agents that act in text."""
    found = settings(
        max_examples=300,
        database=None,
        deadline=None,
        derandomize=True,
        phases=[Phase.generate],  # the first example found is enough: no shrinking
        suppress_health_check=list(HealthCheck),
    )
    assert find(conversation(), lambda m: fired(m, at_point=False), settings=found)
    assert find(conversation(), lambda m: fired(m, at_point=True), settings=found)
    # Text-action sessions that re-read between points are rarer among generated ones: a
    # longer search (the first found still ends it).
    text_agent = find(
        conversation(),
        lambda m: not any(role(x) == "tool" for x in m) and fired(m, at_point=False),
        settings=settings(found, max_examples=2000),
    )
    assert not any(role(m) == "tool" for m in text_agent)
