"""A ``*`` search whose matches do not all fit its room: the best first (lines matching more of
the pattern's terms, then the newest outputs), a line repeated in several outputs shown once,
and the answer says how many it left out and the exact arguments that show them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from policies.pipeline import Offload
from policies.tokens import TokenCounter
from proxy.read_loop.commands import LoopLimits
from proxy.read_loop.store_reads import read_saved_output
from proxy.read_tool.ranking import Hit, ordered, pattern_terms
from proxy.read_tool.search import Found, render_search
from proxy.read_tool.tool import ReadArguments, ReadLimits, render
from proxy.state.sqlite_store import SQLiteStore

COUNTER = TokenCounter()
TENANT = "t_search"
FACT = "dev server started: pid=48213 port=8765 seed=1337 scratch=/tmp/run-7f3a"


def old_output() -> str:
    lines = [f"setup step {n}: ok" for n in range(300)]
    lines[211] = FACT
    return "\n".join(lines)


def newer_output(i: int) -> str:
    """Many lines naming one term each: the noise that filled the room before."""
    return "\n".join(
        f"worker {i}.{n} pid={1000 + n} ready" if n % 2 else f"probe {i}.{n}: port {9000 + n} closed"
        for n in range(120)
    )


OUTPUTS = [Offload(f"out_{i:016x}", old_output() if i == 0 else newer_output(i), "log") for i in range(6)]


@pytest.fixture
async def store(tmp_path: Path) -> Any:
    store = SQLiteStore(tmp_path / "state" / "c.db")
    await store.put_outputs(TENANT, OUTPUTS)
    yield store
    await store.close()


async def search(store: Any, pattern: str, room: int) -> str:
    result = await read_saved_output(
        store,
        TENANT,
        {"handle": "*", "pattern": pattern},
        limits=LoopLimits(),
        room=room,
        counter=COUNTER,
        encoding="o200k_base",
        handles=tuple(o.handle for o in OUTPUTS),  # oldest first, as the session saved them
    )
    return result.text


@pytest.mark.parametrize(
    ("pattern", "terms"),
    [
        ("pid|port|seed", ["pid", "port", "seed"]),
        ("(?i)(pid|port)", ["(?i)pid", "(?i)port"]),
        ("(?:seed|commit)", ["seed", "commit"]),
        ("pid=\\d+", ["pid=\\d+"]),  # no alternatives: one term
        ("(a)(b|c)", ["(a)(b|c)"]),  # alternatives inside a group that is not the whole pattern
        ("[|]x|y", ["[|]x", "y"]),  # a "|" in a class is not an alternative
        ("a\\|b|c", ["a\\|b", "c"]),  # nor an escaped one
    ],
)
def test_the_terms_of_a_pattern_are_its_top_level_alternatives(pattern: str, terms: list[str]) -> None:
    assert pattern_terms(pattern) == terms


def test_best_first_means_more_terms_then_newer_outputs_then_the_lines_place() -> None:
    hits = [
        Hit("new", 0, 5, "a", 1),
        Hit("old", 4, 9, "b", 3),
        Hit("new", 0, 2, "c", 1),
        Hit("mid", 2, 1, "d", 3),
    ]
    assert [(h.handle, h.line) for h in ordered(hits)] == [("mid", 1), ("old", 9), ("new", 2), ("new", 5)]


async def test_a_fact_in_an_old_output_comes_first_when_it_matches_every_term(store: Any) -> None:
    text = await search(store, "pid|port|seed", 400)
    lines = text.splitlines()
    assert lines[0].startswith("Searched 6 saved output(s) for the pattern: 601 matching line(s) in 6.")
    assert "Best first: lines matching more of the pattern's 3 alternatives" in lines[0]
    # The oldest output's one line with all three terms is the first shown, under its handle.
    assert lines[1] == f"handle={OUTPUTS[0].handle}: 1 matching line(s) of 300"
    assert lines[2] == f"212| {FACT}"
    # Then the newest output's lines; what did not fit is counted, and how to see it is exact.
    assert lines[3].startswith(f"handle={OUTPUTS[5].handle}: 120 matching line(s) of 120")
    note = next(line for line in lines if "left out for room" in line)
    left = int(note[1:].split(" ", 1)[0])
    shown = sum(1 for line in lines if "| " in line and line.split("|")[0].strip().isdigit())
    assert left + shown == 601
    example = orjson.dumps({"handle": OUTPUTS[5].handle, "pattern": "pid|port|seed"}).decode()
    assert f"handle={OUTPUTS[5].handle} (" in note and example in note and "more specific pattern" in note
    assert COUNTER.count_text(text) <= 400


async def test_everything_that_fits_with_context_is_shown_with_context(store: Any) -> None:
    text = await search(store, "seed=1337", 2000)
    assert f"212| {FACT}" in text and "210| setup step 209: ok" in text and "214| setup step 213: ok" in text
    assert "left out" not in text and "Newest outputs first." in text


def test_a_line_repeated_in_several_outputs_is_shown_once() -> None:
    found = Found("ERROR", 1)
    for age, handle in enumerate(["out_b", "out_a"]):
        line = "ERROR: disk full"
        found.add(handle, [Hit(handle, age, 3, line, 1, ((3, line),))], 1, 10)
    result = render_search(found, room=500, max_bytes=65_536, counter=COUNTER, encoding="o200k_base")
    assert result.text.count("ERROR: disk full") == 1 and "handle=out_b" in result.text
    assert "1 matching line(s) identical to a line shown are not repeated." in result.text
    assert result.outcome == "ok"


def test_a_pattern_read_goes_on_from_start_line_and_a_cut_read_gives_the_exact_arguments() -> None:
    content = "\n".join(f"line {n}{' MATCH' if n % 3 == 0 else ''}" for n in range(1, 601))

    def read(args: ReadArguments, budget: int) -> str:
        kwargs: dict[str, Any] = {"limits": ReadLimits(), "counter": COUNTER, "encoding": "o200k_base"}
        return render("out_1", content, args, budget_tokens=budget, **kwargs).text

    first = read(ReadArguments("out_1", pattern="MATCH"), 8000)
    assert "(first 50 shown)" in first and "150 more matching line(s) past these" in first
    rest = '{"handle":"out_1","pattern":"MATCH","start_line":151}'
    assert rest in first
    second = read(ReadArguments("out_1", start_line=151, pattern="MATCH"), 8000)
    assert "from line 151 on" in second and "153| line 153 MATCH" in second and "150| " not in second
    page = read(ReadArguments("out_1", start_line=1, num_lines=400), 300)
    note = page.splitlines()[-1]
    assert note.startswith("[Output limited to what fits the context window")
    last = int(page.splitlines()[-2].split("|")[0])
    assert f'{{"handle":"out_1","start_line":{last + 1},"num_lines":{400 - last}}}' in note
