"""The read loop's sans-I/O core with a real store (its ``Read`` commands run by
``read_answers.run_reads``, as the driver runs them): a read that does not fit makes room
(earlier results withdrawn, each naming its handle), the reads of one answer share the room by
need, handle ``*`` searches every saved output of the session, and a search that cannot show a
match's context shows the matching lines alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from policies.pipeline import Offload
from policies.tokens import TokenCounter
from proxy.dialects.base import Answer
from proxy.dialects.chat import ChatDialect
from proxy.read_loop.commands import Command, LoopLimits, Read, Send
from proxy.read_loop.loop import ReadLoop
from proxy.read_loop.store_reads import read_saved_output, run_reads
from proxy.read_tool.tool import ReadArguments, ReadLimits, render
from proxy.state.sqlite_store import SQLiteStore

COUNTER = TokenCounter()
TENANT = "t_reader"
LOG = Offload("out_00000000000000a1", "\n".join(f"log line {i}: ok" for i in range(3000)), "log")
TEST = Offload("out_00000000000000b2", "collected 12 items\n\n12 passed in 0.42s\n", "pytest")
OTHER = Offload("out_00000000000000c3", "Ran 2 tests in 0.182s\nOK\n", "unittest")


@pytest.fixture
async def store(tmp_path: Path) -> Any:
    store = SQLiteStore(tmp_path / "state" / "c.db")
    await store.put_outputs(TENANT, [LOG, TEST])
    await store.put_outputs("t_someone_else", [OTHER])
    yield store
    await store.close()


def call(call_id: str, **arguments: Any) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "read_tool_output", "arguments": orjson.dumps(arguments).decode()},
    }


def loop_for(window: int, filler_tokens: int) -> ReadLoop:
    body = {
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "agent"},
            {"role": "user", "content": " ".join(["word"] * filler_tokens)},
        ],
    }
    loop = ReadLoop(
        body,
        dialect=ChatDialect(),
        counter=COUNTER,
        window=window,
        reserve=1024,
        limits=LoopLimits(),
        handles=(LOG.handle, TEST.handle, OTHER.handle),
    )
    assert isinstance(loop.start(), Send)
    return loop


async def answer(loop: ReadLoop, store: Any, calls: list[Any]) -> Command:
    """An answer of ``calls`` fed to the loop, its reads run against ``store``: the next command."""
    command = loop.feed(Answer(calls=calls))
    while isinstance(command, Read):
        command = loop.resolved(await run_reads(command.reads, loop, store, TENANT))
    return command


def results_of(loop: ReadLoop) -> list[str]:
    return [m["content"] for m in loop.body["messages"] if m["role"] == "tool"]


async def test_a_search_of_every_saved_output_finds_the_line_and_stays_in_its_tenant(store: Any) -> None:
    loop = loop_for(8_000, 1_000)
    read = call("r1", handle="*", pattern="passed|Ran 2 tests")
    await answer(loop, store, [read])
    (text,) = results_of(loop)
    assert "12 passed in 0.42s" in text and f"handle={TEST.handle}" in text
    # Another tenant's output under a handle the session names is never read.
    assert "Ran 2 tests" not in text
    assert text.startswith("Searched 2 saved output(s) for the pattern: 1 matching line(s) in 1.")


async def test_a_search_needs_a_pattern(store: Any) -> None:
    result = await read_saved_output(
        store,
        TENANT,
        {"handle": "*"},
        limits=LoopLimits(),
        room=5_000,
        counter=COUNTER,
        encoding="o200k_base",
    )
    assert result.outcome == "bad_arguments" and "pattern" in result.text


async def test_reads_of_one_answer_share_the_room_by_need(store: Any) -> None:
    """A page of a long log and a search that finds one line: the search is whole."""
    loop = loop_for(8_000, 5_000)
    page, search = (
        call("r1", handle=LOG.handle, num_lines=1000),
        call("r2", handle=TEST.handle, pattern="passed"),
    )
    await answer(loop, store, [page, search])
    paged, searched = results_of(loop)
    assert "12 passed in 0.42s" in searched and "log line 0: ok" in paged
    assert COUNTER.count_text(paged) > COUNTER.count_text(searched)


async def test_a_read_that_does_not_fit_shrinks_earlier_results_which_say_how_to_read_the_rest(
    store: Any,
) -> None:
    loop = loop_for(8_000, 4_500)
    first = call("r1", handle=LOG.handle, num_lines=1000)
    await answer(loop, store, [first])
    assert "log line 0: ok" in results_of(loop)[0]
    second = call("r2", handle=TEST.handle, pattern="passed")
    sent = await answer(loop, store, [second])
    earlier, latest = results_of(loop)
    # Shrunk, not withdrawn: its header and first lines stay, and the rest is one read away.
    assert earlier.startswith(f"handle={LOG.handle}: lines 1-1000 of 3000") and "log line 0: ok" in earlier
    note = earlier.splitlines()[-1]
    last = int(earlier.splitlines()[-2].split("|")[0])
    rest = {"handle": LOG.handle, "start_line": last + 1, "num_lines": 1000 - last}
    assert note == (
        f"[Shortened to make room for later reads: lines {last + 1}-1000 are not shown. "
        f"Read them again: {orjson.dumps(rest).decode()}]"
    )
    assert "12 passed in 0.42s" in latest
    assert loop.result.withdrawn == 0 and "no_room" not in loop.result.reads
    assert isinstance(sent, Send) and loop.dialect.count(sent.body, COUNTER) <= loop.budget
    # Those arguments read exactly the lines cut.
    again = await read_saved_output(
        store, TENANT, rest, limits=LoopLimits(), room=8000, counter=COUNTER, encoding="o200k_base"
    )
    assert f"{last + 1:>4}| log line {last}: ok" in again.text


def test_a_search_whose_context_does_not_fit_shows_the_matching_lines_alone() -> None:
    wide = "x" * 1500
    content = "\n".join(f"{wide} {i}" if i % 50 else f"MATCH {i} {wide}" for i in range(400))
    result = render(
        "out_1",
        content,
        ReadArguments("out_1", pattern="^MATCH"),
        limits=ReadLimits(),
        budget_tokens=900,
        counter=COUNTER,
        encoding="o200k_base",
    )
    shown = [line for line in result.text.splitlines() if "| MATCH" in line]
    assert len(shown) >= 4 and "Matching lines only" in result.text


async def test_with_no_read_room_at_all_a_short_read_may_use_half_the_answers_reserve(store: Any) -> None:
    """A system prompt, tools and task that fill the window: a short search still answers,
    within half the answer's reserve, and the read tool goes after it."""
    loop = loop_for(8_000, 6_930)
    read = call("r1", handle=TEST.handle, pattern="passed")
    assert loop.room_total(Answer(calls=[read]), [read]) < 48
    sent = await answer(loop, store, [read])
    (text,) = results_of(loop)
    assert "12 passed in 0.42s" in text
    assert loop.exhausted and isinstance(sent, Send) and "tools" not in sent.body
    assert loop.dialect.count(loop.body, COUNTER) <= loop.hard_budget
