"""The room of many reads at 8k, with a real store: the reads of one answer that do not all fit
are each answered with what fits and the exact arguments of the rest (never answered whole,
then withdrawn); and a result is withdrawn only when a later round can read it back."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from policies.pipeline import Offload
from proxy.dialects.base import Answer
from proxy.read_loop.commands import LoopLimits, Send
from proxy.read_loop.loop import ReadLoop
from proxy.read_loop.shrink import shrink, water_level
from proxy.read_loop.store_reads import read_saved_output
from tests.proxy.read_loop.test_read_loop import COUNTER, TENANT, answer, call, results_of

OUTPUTS = [
    Offload(f"out_{i:016x}", "\n".join(f"output {i} line {n}: value={n * i}" for n in range(400)), "log")
    for i in range(1, 9)
]
# A single ~6 KB line: a result that cannot be cut by lines.
ONE_LINE = Offload("out_00000000000000ff", " ".join(f"tok{n}" for n in range(1500)), "json")
REST = re.compile(r"(\{\"handle\":[^}]*\})")


@pytest.fixture
async def store(tmp_path: Path) -> Any:
    from proxy.state.sqlite_store import SQLiteStore

    store = SQLiteStore(tmp_path / "state" / "c.db")
    await store.put_outputs(TENANT, [*OUTPUTS, ONE_LINE])
    yield store
    await store.close()


def loop_for(filler: int, limits: LoopLimits | None = None) -> ReadLoop:
    body = {
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "agent"},
            {"role": "user", "content": " ".join(["word"] * filler)},
        ],
    }
    loop = ReadLoop(
        body,
        dialect=__import__("proxy.dialects.chat", fromlist=["ChatDialect"]).ChatDialect(),
        counter=COUNTER,
        window=8_192,
        reserve=1024,
        limits=limits or LoopLimits(),
        handles=tuple(o.handle for o in [*OUTPUTS, ONE_LINE]),
    )
    assert isinstance(loop.start(), Send)
    return loop


async def test_every_read_of_one_answer_gets_what_fits_and_the_exact_arguments_of_the_rest(
    store: Any,
) -> None:
    loop = loop_for(3_500)
    calls = [call(f"r{i}", handle=o.handle) for i, o in enumerate(OUTPUTS)]
    sent = await answer(loop, store, calls)
    results = results_of(loop)
    assert len(results) == len(OUTPUTS) and loop.result.withdrawn == 0
    for output, text in zip(OUTPUTS, results, strict=True):
        assert text.startswith(f"handle={output.handle}: lines 1-200 of 400")
        assert re.search(r"^ *1\| output \d line 0", text, re.M)  # each got content
        (rest,) = REST.findall(text)
        arguments = orjson.loads(rest)
        assert arguments["handle"] == output.handle and arguments["start_line"] > 1
        # The rest is exactly where this result stopped.
        last = max(int(m) for m in re.findall(r"^ *(\d+)\| ", text, re.M))
        assert arguments == {"handle": output.handle, "start_line": last + 1, "num_lines": 200 - last}
    assert isinstance(sent, Send) and loop.dialect.count(sent.body, COUNTER) <= loop.budget


async def test_reading_the_rest_next_round_shrinks_what_was_read_rather_than_withdrawing_it(
    store: Any,
) -> None:
    loop = loop_for(3_500)
    await answer(loop, store, [call(f"r{i}", handle=o.handle) for i, o in enumerate(OUTPUTS)])
    rests = [orjson.loads(REST.findall(text)[0]) for text in results_of(loop)]
    sent = await answer(loop, store, [call(f"s{i}", **rest) for i, rest in enumerate(rests[:4])])
    results = results_of(loop)
    assert loop.result.withdrawn == 0 and loop.result.shrunk > 0
    assert all(re.search(r"^ *\d+\| output", text, re.M) for text in results)  # nothing is empty
    assert isinstance(sent, Send) and loop.dialect.count(sent.body, COUNTER) <= loop.budget


@pytest.mark.parametrize(("max_rounds", "withdrawn"), [(4, 1), (2, 0)])
async def test_a_result_is_withdrawn_only_when_a_later_round_can_read_it_back(
    store: Any, max_rounds: int, withdrawn: int
) -> None:
    loop = loop_for(6_200, LoopLimits(max_rounds=max_rounds))
    await answer(loop, store, [call("r1", handle=ONE_LINE.handle)])
    first = results_of(loop)[0]
    assert "tok0" in first  # one line: it cannot be shrunk by lines
    sent = await answer(loop, store, [call("r2", handle=OUTPUTS[0].handle, num_lines=20)])
    earlier = results_of(loop)[0]
    assert loop.result.withdrawn == withdrawn
    if withdrawn:  # round 2 of 4: the model can read it again in round 3
        assert earlier.startswith("[This read result was withdrawn") and ONE_LINE.handle in earlier
    else:  # the last read round: what the model read stays
        assert earlier == first
    assert isinstance(sent, Send) and loop.dialect.count(sent.body, COUNTER) <= loop.hard_budget


def test_the_water_level_cuts_the_largest_first() -> None:
    assert water_level([1000, 300, 50], 800) == 250  # 750 + 50 freed
    assert water_level([1000, 300], 100) == 900
    assert water_level([150, 120], 10_000) == 100  # never below the floor


def test_a_shrunk_search_keeps_its_best_lines_and_names_the_search_that_gives_the_rest() -> None:
    text = "\n".join(
        [
            "Searched 3 saved output(s) for the pattern: 30 matching line(s) in 2.",
            "handle=out_a: 10 matching line(s) of 50",
            *(f"{n:>2}| pid={n} port={n}" for n in range(1, 11)),
            "handle=out_b: 20 matching line(s) of 90",
            *(f"{n:>2}| pid={n}" for n in range(1, 21)),
            "[Matching lines only, without context, to fit the context window.]",
        ]
    )
    arguments = {"handle": "*", "pattern": "pid|port"}
    shorter = shrink(text, arguments, 120, lambda t: COUNTER.count_text(t, "o200k_base"))
    assert shorter is not None and COUNTER.count_text(shorter, "o200k_base") <= 120
    assert " 1| pid=1 port=1" in shorter and "handle=out_b: 20" not in shorter
    note = shorter.splitlines()[-1]
    assert "(from handle=out_b)" in note and '{"handle":"*","pattern":"pid|port"}' in note
    assert shrink("Error: no saved output", arguments, 10, len) is None


async def test_a_read_with_no_share_of_the_room_says_what_to_ask_for_later(store: Any) -> None:
    result = await read_saved_output(
        store,
        TENANT,
        '{"handle": "out_0000000000000001", "start_line": 5}',
        limits=LoopLimits(),
        room=20,
        counter=COUNTER,
        encoding="o200k_base",
    )
    assert result.outcome == "no_room" and "no room is left in the context window" in result.text
    assert result.text.endswith('{"handle":"out_0000000000000001","start_line":5}')
    assert Answer  # the dialect's answer type is what the loop is fed (imported for the fixture)
