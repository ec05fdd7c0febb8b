"""A conversation's known prefix: counts and digests carried to equal messages, never objects."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson

from policies.builtin_policies import builtin_policy_table
from policies.digests import Digests
from policies.pipeline import Checkpoint, build_policies
from policies.tokens import TokenCounter
from proxy.route.known_prefix import KnownPrefixes
from replay.recording.cases import Case, build_case
from replay.recording.rows import iter_rows

ROOT = Path(__file__).resolve().parents[3]
ENCODING = "o200k_base"


class CountingCounter(TokenCounter):
    """A counter that records which messages it really counted (not looked up)."""

    counted: list[object]

    def _count_message(self, message: object, encoding: str) -> int:
        self.counted.append(message)
        return super()._count_message(message, encoding)


def counter() -> CountingCounter:
    made = CountingCounter()
    made.counted = []
    return made


def fresh(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same messages as a new parse of the wire body makes them: equal, other objects."""
    parsed: list[dict[str, Any]] = orjson.loads(orjson.dumps(messages))
    return parsed


def conversation(steps: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "Fix the failing test."},
    ]
    for step in range(steps):
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{step}",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"c":"ls"}'},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"c{step}", "content": f"output {step} " * 50})
    return messages


def request(base: CountingCounter, digests: Digests) -> tuple[CountingCounter, Digests]:
    scoped = base.for_request()
    assert isinstance(scoped, CountingCounter)
    scoped.counted = []
    return scoped, digests.for_request()


def test_the_known_prefix_is_neither_counted_nor_digested_again() -> None:
    base, digests, known = counter(), Digests(), KnownPrefixes()
    first = fresh(conversation(3))
    scoped, scoped_digests = request(base, digests)
    assert known.adopt("k", first, ENCODING, scoped, scoped_digests) == 0
    tokens = scoped.count_messages(first, ENCODING)
    taken = [scoped_digests.message(m) for m in first]
    known.keep("k", first, 0, ENCODING, scoped, scoped_digests)

    second = fresh(conversation(4))
    scoped, scoped_digests = request(base, digests)
    assert known.adopt("k", second, ENCODING, scoped, scoped_digests) == len(first)
    assert scoped.count_messages(second, ENCODING)[: len(first)] == tokens
    assert scoped.counted == second[len(first) :]  # only the new step is counted
    assert [scoped_digests.message(m) for m in second[: len(first)]] == taken
    # What was carried is what counting and digesting from cold give.
    cold = TokenCounter().for_request()
    assert cold.count_messages(second, ENCODING) == scoped.count_messages(second, ENCODING)
    assert [Digests().message(m) for m in second] == [scoped_digests.message(m) for m in second]


def test_adoption_stops_at_the_first_message_that_differs() -> None:
    base, digests, known = counter(), Digests(), KnownPrefixes()
    first = fresh(conversation(3))
    scoped, scoped_digests = request(base, digests)
    scoped.count_messages(first, ENCODING)
    known.keep("k", first, 0, ENCODING, scoped, scoped_digests)

    edited = fresh(conversation(3))
    edited[3]["content"] = "output 0 (edited by the client)"
    scoped, scoped_digests = request(base, digests)
    assert known.adopt("k", edited, ENCODING, scoped, scoped_digests) == 3
    scoped.count_messages(edited, ENCODING)
    assert scoped.counted == edited[3:]


def test_nothing_is_adopted_for_another_conversation_or_encoding() -> None:
    base, digests, known = counter(), Digests(), KnownPrefixes()
    first = fresh(conversation(2))
    scoped, scoped_digests = request(base, digests)
    scoped.count_messages(first, ENCODING)
    known.keep("k", first, 0, ENCODING, scoped, scoped_digests)
    scoped, scoped_digests = request(base, digests)
    assert known.adopt("other", fresh(first), ENCODING, scoped, scoped_digests) == 0
    assert known.adopt("k", fresh(first), "cl100k_base", scoped, scoped_digests) == 0


def test_conversations_are_bounded_in_number_and_in_tokens() -> None:
    base, digests = counter(), Digests()
    known = KnownPrefixes(max_conversations=2)
    for key in ("a", "b", "c"):
        scoped, scoped_digests = request(base, digests)
        known.keep(key, fresh(conversation(1)), 0, ENCODING, scoped, scoped_digests)
    assert len(known) == 2
    scoped, scoped_digests = request(base, digests)
    assert known.adopt("a", fresh(conversation(1)), ENCODING, scoped, scoped_digests) == 0

    small = KnownPrefixes(max_tokens=4000)
    scoped, scoped_digests = request(base, digests)
    small.keep("big", fresh(conversation(20)), 0, ENCODING, scoped, scoped_digests)
    assert len(small) == 0  # over a quarter of the budget: not kept


def test_a_policy_sees_the_same_view_with_and_without_the_known_prefix() -> None:
    """The improved policy over a recorded trajectory, step by step: identical outcomes."""
    table = builtin_policy_table()
    policy = build_policies(
        {n: (c["description"], c["stages"], c["safeguard"], (), ()) for n, c in table.items()}
    )["improved"]
    rows = iter_rows(ROOT / "tests" / "fixtures" / "sample_trajectories.jsonl")
    case = next(
        c for c in (build_case(r, i) for i, r in enumerate(rows)) if isinstance(c, Case) and len(c.steps) > 20
    )

    async def run(use_known: bool) -> list[tuple[Any, ...]]:
        base, digests, known = TokenCounter(), Digests(), KnownPrefixes()
        checkpoint: Checkpoint | None = None
        seen = []
        for step in case.steps[:30]:
            body: dict[str, Any] = orjson.loads(
                orjson.dumps({"model": "gpt-4o", "messages": case.messages[:step]})
            )
            scoped, scoped_digests = base.for_request(), digests.for_request()
            adopted = known.adopt("k", body["messages"], ENCODING, scoped, scoped_digests) if use_known else 0
            outcome = await policy.apply(
                body, scoped, window=8000, checkpoint=checkpoint, digests=scoped_digests
            )
            if use_known:
                known.keep("k", body["messages"], adopted, ENCODING, scoped, scoped_digests)
            checkpoint = outcome.checkpoint
            seen.append((outcome.messages, outcome.tokens_before, outcome.tokens_after, outcome.mechanisms))
        return seen

    assert asyncio.run(run(True)) == asyncio.run(run(False))


def test_the_messages_kept_are_each_ones_first_parse() -> None:
    """The next request's equal messages are not kept (the first parse's are): a long
    conversation keeps one copy of each message, the one whose texts the count cache holds."""
    base, digests, known = counter(), Digests(), KnownPrefixes()
    first = fresh(conversation(2))
    scoped, scoped_digests = request(base, digests)
    scoped.count_messages(first, ENCODING)
    known.keep("k", first, 0, ENCODING, scoped, scoped_digests)
    second = fresh(conversation(3))
    scoped, scoped_digests = request(base, digests)
    adopted = known.adopt("k", second, ENCODING, scoped, scoped_digests)
    scoped.count_messages(second, ENCODING)
    known.keep("k", second, adopted, ENCODING, scoped, scoped_digests)
    kept = known._known["k"].messages
    assert all(kept[i] is first[i] for i in range(len(first)))
    assert all(kept[i] is second[i] for i in range(len(first), len(second)))


def test_a_zero_budget_keeps_nothing() -> None:
    base, digests, known = counter(), Digests(), KnownPrefixes(max_tokens=0)
    scoped, scoped_digests = request(base, digests)
    known.keep("k", fresh(conversation(1)), 0, ENCODING, scoped, scoped_digests)
    assert len(known) == 0
