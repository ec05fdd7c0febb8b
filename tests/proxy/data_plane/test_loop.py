"""The pure read loop (``proxy/read_loop/loop.py``): the commands it gives for scripted answers and
read results, with the real ``ChatDialect`` and no I/O at all (reads are answered with made-up
results, or by ``run_reads`` against an in-memory store). A read round; a read mixed with the
agent's own calls; rounds running out; the room of an answer's reads shared by need; a read
that does not fit making room by withdrawing earlier results; a round that comes out larger than
the hard budget sent without those reads and without the tool; no room at all; a stream the
upstream did not finish; calls out of turn."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.dialects.base import Answer
from proxy.dialects.chat import ChatDialect
from proxy.read_loop.answers import NO_ROOM, ReadCall
from proxy.read_loop.commands import Done, Fail, LoopLimits, LoopMisuse, Read, Received, Send
from proxy.read_loop.loop import ReadLoop
from proxy.read_loop.store_reads import run_reads
from proxy.read_tool.tool import ReadResult
from tests.proxy.data_plane import chat_wire as chat
from tests.proxy.data_plane.harness import COUNTER, HANDLE, TENANT, MemoryStore

CHAT = ChatDialect()
READ = chat.read().as_message_part()
BASH = chat.bash().as_message_part()


def loop_for(*, filler: int = 0, window: int = 128_000, limits: LoopLimits | None = None) -> ReadLoop:
    return ReadLoop(
        chat.body(filler=filler),
        dialect=CHAT,
        counter=COUNTER,
        window=window,
        reserve=1024,
        limits=limits or LoopLimits(),
        handles=(HANDLE,),
    )


def read_call(call_id: str, **arguments: Any) -> dict[str, Any]:
    return chat.read(call_id, **arguments).as_message_part()


def words(count: int) -> str:
    """A text of ``count`` tokens."""
    return " ".join(["word"] * count)


def tokens(text: str) -> int:
    return COUNTER.count_text(text, "o200k_base")


def tool_names(body: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in body.get("tools", [])]


def results_in(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def test_a_read_round_sends_the_read_then_the_round_then_ends_with_usage_summed() -> None:
    loop = loop_for()
    first = loop.start()
    assert isinstance(first, Send) and first.body == chat.body()
    assert (first.tokens_after, first.read_rounds) == (CHAT.count(chat.body(), COUNTER), 0)
    room = loop.room_total(Answer(calls=[READ]), [READ])
    command = loop.feed(Answer(calls=[READ], usage=chat.usage(100, 10)))
    # One read, with all the room (at most the cap per result), nothing read before it.
    assert command == Read((ReadCall(READ["function"]["arguments"], min(8000, room), 0),))
    second = loop.resolved([ReadResult("log line 1: ok\nlog line 2: ok", "ok")])
    assert isinstance(second, Send) and second.read_rounds == 1
    assert second.body["messages"] == [
        *chat.body()["messages"],
        {"role": "assistant", "content": None, "tool_calls": [READ]},
        {"role": "tool", "tool_call_id": "call_read_1", "content": "log line 1: ok\nlog line 2: ok"},
    ]
    assert tool_names(second.body) == ["bash", "read_tool_output"]  # rounds are left
    assert second.tokens_after == CHAT.count(second.body, COUNTER) > first.tokens_after
    done = loop.feed(Answer(calls=[], text="It failed.", usage=chat.usage(300, 7)))
    assert done == Done({"prompt_tokens": 300, "completion_tokens": 17, "total_tokens": 317})
    result = loop.result
    assert (result.rounds, result.reads, result.bytes_read) == (1, ["ok"], 29)
    assert result.usage_per_round == [chat.usage(100, 10), chat.usage(300, 7)]
    assert result.round_tokens == [first.tokens_after, second.tokens_after]
    assert result.final_answer == [] and result.error is None


def test_a_read_mixed_with_the_agents_calls_is_read_and_the_agents_calls_are_not_run() -> None:
    loop = loop_for()
    loop.start()
    command = loop.feed(Answer(calls=[READ, BASH], text="Checking the log first."))
    assert isinstance(command, Read) and [r.arguments for r in command.reads] == [
        READ["function"]["arguments"]
    ]
    sent = loop.resolved([ReadResult("log line 1: ok", "ok")])
    assert isinstance(sent, Send)
    # Chat sends the round back without the agent's call: the model issues it again if needed.
    assistant, tool = sent.body["messages"][-2:]
    assert assistant == {"role": "assistant", "content": "Checking the log first.", "tool_calls": [READ]}
    assert tool["tool_call_id"] == "call_read_1"
    # The agent's own call in an answer without reads is the answer.
    assert isinstance(loop.feed(Answer(calls=[BASH])), Done)
    assert loop.result.reads == ["ok"]


def test_when_rounds_run_out_the_last_round_goes_without_the_tool_and_its_reads_are_not_run() -> None:
    loop = loop_for(limits=LoopLimits(max_rounds=2))
    loop.start()
    sends = []
    for n in (1, 2):
        assert isinstance(loop.feed(Answer(calls=[read_call(f"r{n}")])), Read)
        sent = loop.resolved([ReadResult(f"result {n}", "ok")])
        assert isinstance(sent, Send)
        sends.append(sent)
    assert tool_names(sends[0].body) == ["bash", "read_tool_output"]
    assert tool_names(sends[1].body) == ["bash"] and sends[1].read_rounds == 2
    # The model reads again anyway: no more reads, that answer is the client's.
    done = loop.feed(Answer(calls=[read_call("r3")], usage=chat.usage(50, 5)))
    assert isinstance(done, Done)
    assert (loop.result.rounds, loop.result.reads) == (2, ["ok", "ok"])


def test_past_the_byte_limit_the_next_round_goes_without_the_tool() -> None:
    loop = loop_for(limits=LoopLimits(max_total_bytes=1000))
    loop.start()
    loop.feed(Answer(calls=[READ]))
    sent = loop.resolved([ReadResult("x" * 1000, "truncated")])
    assert isinstance(sent, Send) and tool_names(sent.body) == ["bash"] and loop.exhausted


def test_the_reads_of_one_answer_run_one_at_a_time_and_share_the_room_by_need() -> None:
    loop = loop_for(filler=3000, window=8000)
    loop.start()
    page, search, third = read_call("r1", num_lines=1000), read_call("r2", pattern="ok"), read_call("r3")
    calls = [page, search, third]
    room = loop.room_total(Answer(calls=calls), calls)
    big, small, medium = words(room), words(40), words(room // 2)
    command = loop.feed(Answer(calls=calls))
    assert command == Read((ReadCall(page["function"]["arguments"], room, 0),))
    # Each read counts the bytes the request read before it (the byte limit holds).
    command = loop.resolved([ReadResult(big, "truncated")])
    assert command == Read((ReadCall(search["function"]["arguments"], room, len(big)),))
    command = loop.resolved([ReadResult(small, "ok")])
    assert command == Read((ReadCall(third["function"]["arguments"], room, len(big) + len(small)),))
    command = loop.resolved([ReadResult(medium, "truncated")])
    # Together they do not fit: the small search keeps what it needs, the two others are read
    # again (in one Read: they do not depend on each other), sharing the rest.
    share = (room - tokens(small)) // 2
    assert command == Read(
        (
            ReadCall(page["function"]["arguments"], share, 0),
            ReadCall(third["function"]["arguments"], share, len(big) + len(small)),
        )
    )
    sent = loop.resolved(
        [ReadResult("page, shorter", "truncated"), ReadResult("third, shorter", "truncated")]
    )
    assert isinstance(sent, Send)
    assert results_in(sent.body) == ["page, shorter", small, "third, shorter"]
    assert loop.result.bytes_read == len("page, shorter") + len(small) + len("third, shorter")


def test_reads_past_the_limit_per_answer_are_told_to_wait() -> None:
    loop = loop_for(limits=LoopLimits(max_calls_per_answer=1))
    loop.start()
    command = loop.feed(Answer(calls=[read_call("r1"), read_call("r2")]))
    assert isinstance(command, Read) and len(command.reads) == 1
    sent = loop.resolved([ReadResult("first", "ok")])
    assert isinstance(sent, Send)
    assert results_in(sent.body) == [
        "first",
        "Error: at most 1 reads per answer; ask for the rest in your next answer.",
    ]
    assert loop.result.reads == ["ok", "limited"]


async def test_a_read_that_does_not_fit_withdraws_earlier_results_to_make_room() -> None:
    loop = loop_for(filler=4500, window=8000)
    store = MemoryStore()
    loop.start()
    first = read_call("r1", num_lines=1000)
    command = loop.feed(Answer(calls=[first]))
    assert isinstance(command, Read)
    earlier = words(command.reads[0].room - 60)  # nearly all of the room
    loop.resolved([ReadResult(earlier, "truncated")])
    second = read_call("r2", num_lines=5)
    assert loop.room_total(Answer(calls=[second]), [second]) < 250  # no useful room left
    command = loop.feed(Answer(calls=[second]))
    assert isinstance(command, Read)
    (read,) = command.reads
    assert read.room >= 250 and read.bytes_read == len(earlier)
    sent = loop.resolved(await run_reads(command.reads, loop, store, TENANT))  # type: ignore[arg-type]
    assert isinstance(sent, Send) and store.gets == [HANDLE]
    withdrawn, latest = results_in(sent.body)
    assert withdrawn == (
        f"[This read result was withdrawn to make room for later reads; read handle={HANDLE} again if you "
        "still need it.]"
    )
    assert "log line 1: ok" in latest and "log line 5: ok" in latest
    assert loop.result.withdrawn == 1 and loop.result.reads == ["truncated", "ok"]
    assert CHAT.count(sent.body, COUNTER) <= loop.budget
    assert tool_names(sent.body) == ["bash", "read_tool_output"]


def test_a_round_larger_than_the_hard_budget_goes_without_its_reads_and_without_the_tool() -> None:
    loop = loop_for(filler=3000, window=8000)
    before = loop.start()
    assert isinstance(before, Send)
    command = loop.feed(Answer(calls=[READ]))
    assert isinstance(command, Read)
    # A result far larger than the room it was given (the loop counts per piece).
    sent = loop.resolved([ReadResult(words(command.reads[0].room + 2000), "ok")])
    assert isinstance(sent, Send)
    assert sent.body == CHAT.without_read_tool(before.body)
    assert CHAT.count(sent.body, COUNTER) <= loop.hard_budget and loop.exhausted
    assert loop.body is before.body  # the loop goes on from the round before the reads


def test_with_no_read_room_a_short_read_may_take_from_the_answers_reserve_and_the_tool_goes() -> None:
    loop = loop_for(filler=6800, window=8000)
    loop.start()
    assert loop.room_total(Answer(calls=[READ]), [READ]) < 48
    hard = loop.room_total(Answer(calls=[READ]), [READ], hard=True)
    command = loop.feed(Answer(calls=[READ]))
    assert command == Read((ReadCall(READ["function"]["arguments"], min(400, hard), 0),))
    sent = loop.resolved([ReadResult("12 passed in 0.42s", "ok")])
    assert isinstance(sent, Send) and tool_names(sent.body) == ["bash"]
    assert results_in(sent.body) == ["12 passed in 0.42s"]


@pytest.mark.parametrize(("filler", "answered"), [(7100, True), (7300, False)])
def test_with_no_room_at_all_the_reads_are_refused_without_reading(filler: int, answered: bool) -> None:
    loop = loop_for(filler=filler, window=8000)
    first = loop.start()
    assert isinstance(first, Send)
    sent = loop.feed(Answer(calls=[READ]))  # no Read: nothing is read
    assert isinstance(sent, Send) and tool_names(sent.body) == ["bash"]
    if answered:  # each call is told there is no room
        assert results_in(sent.body) == [NO_ROOM]
    else:  # not even that fits: asked again without the calls
        assert sent.body == CHAT.without_read_tool(first.body)
    assert (loop.result.reads, loop.result.rounds, sent.read_rounds) == (["no_room"], 1, 1)


def test_a_stream_the_upstream_did_not_finish_fails_unless_it_reads() -> None:
    def never() -> Answer:
        raise AssertionError("the whole answer is built only for a read round")

    loop = loop_for()
    loop.start()
    command = loop.feed(Received([BASH], chat.usage(10, 1), [], never, complete=False))
    assert isinstance(command, Fail)
    assert (command.error.status, command.error.code) == (502, "upstream_reset")
    assert loop.result.error == "upstream_reset" and loop.result.final_answer is None
    assert loop.result.usage_per_round == [chat.usage(10, 1)]
    # An unfinished answer whose read calls are known still gets its reads.
    loop = loop_for()
    loop.start()
    command = loop.feed(Received([READ], None, [], lambda: Answer(calls=[READ]), complete=False))
    assert isinstance(command, Read)


def test_a_finished_answer_without_reads_never_builds_its_whole_answer() -> None:
    def never() -> Answer:
        raise AssertionError("the whole answer is built only for a read round")

    loop = loop_for()
    loop.start()
    items = [{"type": "text", "text": "done"}]
    assert loop.feed(Received([], chat.usage(10, 1), items, never)) == Done(
        {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}
    )
    assert loop.result.final_answer == items


def test_calls_out_of_turn_are_refused() -> None:
    loop = loop_for()
    with pytest.raises(LoopMisuse):
        loop.feed(Answer(calls=[]))
    loop.start()
    with pytest.raises(LoopMisuse):
        loop.start()
    with pytest.raises(LoopMisuse):
        loop.resolved([])
    loop.feed(Answer(calls=[READ]))
    with pytest.raises(ValueError):
        loop.resolved([ReadResult("one", "ok"), ReadResult("two", "ok")])
    with pytest.raises(LoopMisuse):
        loop.feed(Answer(calls=[]))
