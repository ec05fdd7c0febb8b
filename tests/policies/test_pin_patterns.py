"""Pin patterns run on RE2, the engine reads use: a pattern that backtracks catastrophically in
Python's ``re`` matches in linear time, and what RE2 cannot compile stops the start."""

from __future__ import annotations

import time

import pytest

from policies.pipeline import PolicyConfigError, build_pins, build_policy


def test_a_backtracking_pin_pattern_is_linear_on_a_hostile_message() -> None:
    pins = build_pins("improved", (), [r"^(\s*\w+)*:\s*Error"])
    hostile = [
        {"role": "user", "content": "task"},
        {"role": "tool", "tool_call_id": "c", "content": " a" * 20_000 + "!"},
    ]
    started = time.perf_counter()
    pins.pinned_steps(hostile)
    # Python's re takes minutes on this text; RE2 milliseconds (a generous bound for CI).
    assert time.perf_counter() - started < 2.0


def test_a_pattern_re2_cannot_compile_stops_the_policy_with_its_name() -> None:
    with pytest.raises(
        PolicyConfigError, match=r"policies.mine.pins.patterns: '\(a\)\\\\1' is not a valid RE2"
    ):
        build_policy("mine", "", [{"trigger": {}}], pin_patterns=[r"(a)\1"])


def test_pins_still_match() -> None:
    pins = build_pins("p", (), [r"FAILED \w+"])
    messages = [{"role": "user", "content": "task"}, {"role": "assistant", "content": "FAILED test_x"}]
    assert pins.pinned_steps(messages) == {1}
