"""Whether an output failed: its exit code when it reports one, else any of the failure
markers anywhere in it (searched in one pass, with the same answer as a search for each)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from policies.stages.outputs import _FAILURE_MARKERS, failed

_PIECES = st.one_of(st.text(max_size=40), st.sampled_from([*_FAILURE_MARKERS, "é", "日本", "ERROR", "\n"]))


@given(st.lists(_PIECES, max_size=12))
def test_one_search_finds_what_a_search_for_each_marker_finds(pieces: list[str]) -> None:
    text = "".join(pieces)
    if "exit code" in text.lower() or "exit_code" in text.lower() or "returncode" in text:
        return  # an exit code decides instead
    assert failed.__wrapped__(text) == any(marker in text for marker in _FAILURE_MARKERS)


def test_an_exit_code_decides_before_the_markers() -> None:
    assert not failed.__wrapped__("ERROR: nothing\nexit code 0")
    assert failed.__wrapped__("all good\nexit code 2")
    assert failed.__wrapped__("x\nTraceback (most recent call last)\n")
