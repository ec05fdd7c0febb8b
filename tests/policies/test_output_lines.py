"""The ledger's whole-text scan finds exactly the lines the per-line rule finds."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from policies.output_lines import ERROR_LINE, TEST_SUMMARY, error_lines, summary_lines

_PIECES = st.sampled_from(
    [
        "error: boom",
        "Error",
        "ValueError: bad",
        "  FAILED tests/x.py::t",
        "fatal:",
        "fatal\tx",
        "error",
        "errors",
        "KeyboardInterrupt ",
        "SystemExit:",
        "3 passed",
        "2 xpassed",
        "5 deselected",
        "\u0663 passed",
        "7",
        " skipped",
        "warning",
        "FAILED: 1 failed",
        "1 failed, 2 passed in 0.3s",
        "= 2 errors in 1.0s =",
        "10 warnings",
        "ok",
        "def f():",
        " ",
        "\t",
        ":",
        "x",
        "1",
        "passed",
        "\n",
        "\n\n",
        "\r\n",
        "\r",
        "\x0c",
        "\u2028",
        "\x1c",
        "\x85",
        "\x1f",
    ]
)


def per_line_errors(text: str) -> list[str]:
    return [line for line in text.splitlines() if ERROR_LINE.match(line)]


def per_line_summaries(text: str) -> list[str]:
    words = ("passed", "failed", "error")
    return [
        line
        for line in text.splitlines()
        if TEST_SUMMARY.search(line) and any(word in line for word in words)
    ]


@given(st.lists(_PIECES, max_size=30).map("".join))
def test_the_whole_text_scan_agrees_with_the_per_line_rule(text: str) -> None:
    assert list(error_lines(text)) == per_line_errors(text)
    assert list(summary_lines(text)) == per_line_summaries(text)


def test_lines_come_whole_and_in_order() -> None:
    text = "start\n  ValueError: bad value\nok\n== 3 passed, 1 failed in 2.1s ==\nerror:x"
    assert list(error_lines(text)) == ["  ValueError: bad value", "error:x"]
    assert list(summary_lines(text)) == ["== 3 passed, 1 failed in 2.1s =="]
    # A line ending in a bare name is not an error line: a colon or a blank must follow it.
    assert list(error_lines("error\nfatal")) == []
