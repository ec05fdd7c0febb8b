"""Context windows per model: a model no pattern matches gets the default window, and the
proxy is told (once per name, at most 32 names) so the operator can add it to the table."""

from __future__ import annotations

from policies.windows import ContextWindows


def test_a_model_no_pattern_matches_is_told_once_and_at_most_32_names() -> None:
    told: list[tuple[str, int]] = []
    windows = ContextWindows(
        {"gpt-4o*": 128_000, "default": 32_000}, on_default=lambda m, w: told.append((m, w))
    )
    assert windows.window_for("gpt-4o-mini") == 128_000 and told == []
    assert windows.window_for("my-local-model") == 32_000
    assert windows.window_for("my-local-model") == 32_000
    assert told == [("my-local-model", 32_000)]
    for n in range(100):
        windows.window_for(f"other-{n}")
    assert len(told) == 32
