"""Work a request has already done is not done again: the steps of a message list are parsed
once per list, a checkpoint is re-applied without parsing the client's history when its
summarized range cannot hold the last user message, messages past the last decision are taken
as they are, and a conversation's known prefix is not counted message by message again."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import policies.pipeline
import policies.view
from policies.conversation import Message, parse
from policies.digests import Digests
from policies.pipeline import Checkpoint, View, apply_checkpoint, build_policy
from policies.tokens import TokenCounter


def exchange(step: int, output: str = "ok") -> list[Message]:
    call = {"id": f"c{step}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{step}", "content": f"{output} {step}\n" * 40},
    ]


def history(steps: int) -> list[Message]:
    messages: list[Message] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "fix it"}]
    for step in range(steps):
        messages += exchange(step)
    return messages


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The lengths of the lists ``View`` parses."""
    seen: list[int] = []

    def counting(messages: Any) -> Any:
        seen.append(len(messages))
        return parse(messages)

    monkeypatch.setattr(policies.view, "parse", counting)
    monkeypatch.setattr(policies.pipeline, "parse", counting)
    return seen


def view_of(messages: list[Message], checkpoint: Checkpoint) -> View:
    return View(
        messages=list(messages), original=messages, origin=list(range(len(messages))), checkpoint=checkpoint
    )


def test_a_view_parses_each_list_once(parses: list[int]) -> None:
    messages = history(3)
    view = view_of(messages, Checkpoint())
    first = view.conversation()
    assert view.conversation() is first and parses == [len(messages)]
    view.replace_messages(messages[:4], "test")
    assert view.conversation().steps[-1].end == 4 and parses == [len(messages), 4]
    assert view.original_conversation() is view.original_conversation()
    assert parses == [len(messages), 4, len(messages)]


def summarized(messages: list[Message], at: int, end: int, digests: Digests, **fields: Any) -> Checkpoint:
    return Checkpoint(
        summary={"role": "user", "content": "summary"},
        summary_at=at,
        covered=end - at,
        covered_digest=digests.range(messages[at:end]),
        **fields,
    )


def test_a_summary_without_a_user_message_is_reapplied_without_parsing(parses: list[int]) -> None:
    messages = history(6)
    digests = Digests()
    view = view_of(messages, summarized(messages, 2, 8, digests))
    apply_checkpoint(view, digests)
    assert parses == []
    assert view.messages == [*messages[:2], view.checkpoint.summary, *messages[8:]]


def test_a_summary_that_holds_the_last_user_message_is_still_dropped(parses: list[int]) -> None:
    messages = [*history(2), {"role": "user", "content": "actually, do this"}, *exchange(9)]
    digests = Digests()
    view = view_of(messages, summarized(messages, 2, 7, digests))
    apply_checkpoint(view, digests)
    assert parses == [len(messages)]
    assert view.facts.checkpoint_dropped == "the summarized range holds the last user message"


def test_messages_after_the_last_decision_are_the_clients_own() -> None:
    messages = history(5)
    digests = Digests()
    placeholder = {**messages[3], "content": "[saved: handle=out_1]"}
    key = digests.at(3, messages[3])
    view = view_of(messages, Checkpoint(placeholders={key: placeholder}))
    apply_checkpoint(view, digests)
    assert view.messages[3] is placeholder
    assert all(view.messages[i] is messages[i] for i in range(len(messages)) if i != 3)
    assert view.origin == list(range(len(messages))) and view.changed


def test_a_known_prefix_is_not_counted_message_by_message(monkeypatch: pytest.MonkeyPatch) -> None:
    messages = history(8)
    expected = TokenCounter().count_messages(messages, "o200k_base")
    counter = TokenCounter().for_request()
    counter.remember_prefix(messages, "o200k_base", expected[:10])
    counted: list[object] = []
    original = TokenCounter.count_message

    def counting(self: TokenCounter, message: object, encoding: str) -> int:
        counted.append(message)
        return original(self, message, encoding)

    monkeypatch.setattr(TokenCounter, "count_message", counting)
    assert counter.count_messages(messages, "o200k_base") == expected
    assert counted == messages[10:]


def test_remembered_counts_belong_to_their_objects_and_their_encoding() -> None:
    messages = history(3)
    counter = TokenCounter().for_request()
    counter.remember_all(messages, "o200k_base", [9999] * len(messages))
    assert [counter.count_message(m, "o200k_base") for m in messages] == [9999] * len(messages)
    # Another encoding, or an equal message that is another object, is counted for real.
    fresh = TokenCounter()
    assert counter.count_message(messages[1], "cl100k_base") == fresh.count_message(
        messages[1], "cl100k_base"
    )
    twin = dict(messages[1])
    assert counter.count_message(twin, "o200k_base") == fresh.count_message(twin, "o200k_base") != 9999
    # The request's counter keeps every message it remembers alive: no id names another object.
    del messages[:]
    others = [{"role": "user", "content": f"other {i}"} for i in range(50)]
    assert all(counter.count_message(m, "o200k_base") != 9999 for m in others)


def test_a_prefix_changed_in_place_is_counted_again() -> None:
    messages = history(4)
    counter = TokenCounter().for_request()
    counter.remember_prefix(messages, "o200k_base", (1,) * 6)  # counts that no longer hold
    messages[3] = {"role": "tool", "tool_call_id": "c0", "content": "changed"}
    assert counter.count_messages(messages, "o200k_base") == TokenCounter().count_messages(
        messages, "o200k_base"
    )


def test_a_policys_context_reads_its_stages_once() -> None:
    policy = build_policy("p", "", [{"summarize": {"ledger_share": 0.2}}, {"offload": {}}])
    body = {"model": "gpt-4o", "messages": history(2)}
    counter = TokenCounter()
    ctx = policy._context(
        body,
        counter,
        counter.count_request(body),
        window=8000,
        summarizer=None,
        digests=Digests(),
        injected_tokens=0,
    )
    assert (ctx.summarizes, ctx.ledger_share, ctx.edit_artifacts, ctx.transcripts) == (True, 0.2, True, True)
    assert ctx.read_room == policy.stages[-1].read_room(8000) > 0  # type: ignore[attr-defined]
    outcome = asyncio.run(policy.apply(body, counter, window=8000))
    assert outcome.tokens_before > 0


def test_a_view_made_from_a_checkpoint_is_counted_from_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a compaction point, each message of the client's the view keeps was counted with
    the request: the view's count takes it from there (placeholders are counted), exactly."""
    policy = build_policy("p", "", [{"offload": {"min_tokens": 10, "keep_recent": 2}}])
    first = asyncio.run(policy.apply({"model": "gpt-4o", "messages": history(8)}, TokenCounter(), force=True))
    assert first.checkpoint.placeholders
    body = {"model": "gpt-4o", "messages": history(9)}
    calls: list[int] = []
    original = TokenCounter.count_message

    def counting(self: TokenCounter, message: object, encoding: str) -> int:
        calls.append(id(message))
        return original(self, message, encoding)

    monkeypatch.setattr(TokenCounter, "count_message", counting)
    counter = TokenCounter().for_request()
    outcome = asyncio.run(policy.apply(body, counter, checkpoint=first.checkpoint))
    monkeypatch.setattr(TokenCounter, "count_message", original)
    assert outcome.messages is not None and outcome.messages != body["messages"]
    client = {id(m) for m in body["messages"]}
    assert all(calls.count(i) == 1 for i in client & set(calls))  # each once, with the request
    fresh = TokenCounter()
    assert outcome.tokens_after == fresh.count_request({**body, "messages": outcome.messages}).total
