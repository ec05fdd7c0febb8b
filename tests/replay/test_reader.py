"""The scripted reader: first one search of every saved output (handle "*"), then every handle a
view names with a search for the missing evidence
(and for the handles a saved text names, followed in the next round); evidence counts as read
back only from what the proxy's read results hold."""

from __future__ import annotations

import orjson

from replay.session.reader import CALLS_PER_ANSWER, Reader, search_pattern


def test_the_pattern_matches_the_evidence_literally_and_handle_mentions() -> None:
    import re2

    pattern = search_pattern(["a.b (c) [d] $1", "x|y"])
    regex = re2.compile(pattern)
    assert regex.search("before a.b (c) [d] $1 after")
    assert regex.search("x|y") and not regex.search("axb (c) [d] $1")
    assert regex.search("see handle=out_0123456789abcdef")


def test_the_reader_reads_named_handles_then_follows_what_the_results_name() -> None:
    handles = [f"out_{i:016x}" for i in range(CALLS_PER_ANSWER + 2)]
    view = "summary " + " ".join(f"handle={h}" for h in handles)
    reader = Reader(("Ran 2 tests in 0.182s",))
    search = reader.answer([], ["read_tool_output", "bash"], view)
    assert search is not None and len(search["tool_calls"]) == 1
    args = orjson.loads(search["tool_calls"][0]["function"]["arguments"])
    assert args == {"handle": "*", "pattern": r"Ran 2 tests in 0\.182s"}
    nothing = [{"role": "tool", "tool_call_id": search["tool_calls"][0]["id"], "content": "matches in 0."}]
    first = reader.answer([search, *nothing], ["read_tool_output", "bash"], view)
    assert first is not None and len(first["tool_calls"]) == CALLS_PER_ANSWER
    args = orjson.loads(first["tool_calls"][0]["function"]["arguments"])
    assert args["handle"] == handles[0] and "Ran 2 tests" in args["pattern"]
    results = [
        {
            "role": "tool",
            "tool_call_id": c["id"],
            "content": "0 matching line(s); handle=out_ffffffffffffffff",
        }
        for c in first["tool_calls"]
    ]
    second = reader.answer([first, *results], ["read_tool_output"], view)
    assert second is not None
    assert [orjson.loads(c["function"]["arguments"])["handle"] for c in second["tool_calls"]] == [
        *handles[CALLS_PER_ANSWER:],
        "out_ffffffffffffffff",
    ]
    found = [
        {
            "role": "tool",
            "tool_call_id": second["tool_calls"][-1]["id"],
            "content": "12: Ran 2 tests in 0.182s",
        }
    ]
    assert reader.answer([second, *found], ["read_tool_output"], view) is None
    assert reader.found() == ["Ran 2 tests in 0.182s"]
    assert reader.figures() == {"read_calls": CALLS_PER_ANSWER + 4, "read_rounds": 3, "no_room_reads": 0}


def test_nothing_is_read_when_the_evidence_is_visible_or_the_tool_is_not_offered() -> None:
    assert Reader(("x",)).answer([], ["read_tool_output"], "x handle=out_0123456789abcdef") is None
    assert Reader(("y",)).answer([], ["bash"], "x handle=out_0123456789abcdef") is None
