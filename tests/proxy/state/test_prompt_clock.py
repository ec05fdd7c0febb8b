"""The proxy's clock of each session's prefix: the time since its previous request, by the
wall clock or a replay's ``X-Compaction-Clock``, the door's provider cache, never cold when
replicas share the sessions, bounded."""

from __future__ import annotations

import pytest

from proxy.config.prompt_cache import PromptCacheSettings
from proxy.config.sections import ModelSettings
from proxy.state.prompt_clock import PromptClock
from proxy.telemetry.session_summary import cache_price_shares


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_wall_clock_tells_a_session_back_after_the_lifetime_it_is_cold() -> None:
    time = FakeTime()
    clock = PromptClock(PromptCacheSettings(), max_sessions=10, now=time)
    first = clock.observe("s", "chat", [])
    assert first is not None and first.idle_seconds is None and not first.cold
    time.now += 20
    warm = clock.observe("s", "chat", [])
    assert warm is not None and warm.idle_seconds == 20 and not warm.cold
    time.now += 301
    cold = clock.observe("s", "chat", [])
    assert cold is not None and cold.cold
    # Another session has its own time.
    other = clock.observe("t", "chat", [])
    assert other is not None and other.idle_seconds is None


def test_each_door_has_its_providers_cache() -> None:
    clock = PromptClock(PromptCacheSettings(), max_sessions=10, now=FakeTime())
    anthropic = clock.observe("a", "anthropic", [])
    gemini = clock.observe("g", "code_assist", [])
    openai = clock.observe("o", "responses", [])
    assert anthropic is not None and (anthropic.read_price, anthropic.write_price) == (0.1, 1.25)
    assert gemini is not None and gemini.read_price == 0.25
    assert openai is not None and (openai.read_price, openai.write_price) == (0.5, 1.0)


def test_the_request_clock_reads_the_header_and_without_it_is_time_blind() -> None:
    clock = PromptClock(PromptCacheSettings(clock="request"), max_sessions=10)
    assert clock.observe("s", "chat", []) is None
    assert clock.observe("s", "chat", [(b"x-compaction-clock", b"nonsense")]) is None
    assert clock.observe("s", "chat", [(b"x-compaction-clock", b"nan")]) is None
    clock.observe("s", "chat", [(b"x-compaction-clock", b"10")])
    later = clock.observe("s", "chat", [(b"x-compaction-clock", b"920.5")])
    assert later is not None and later.idle_seconds == 910.5 and later.cold


def test_shared_sessions_are_never_taken_for_cold_and_disabled_is_time_blind() -> None:
    time = FakeTime()
    shared = PromptClock(PromptCacheSettings(), max_sessions=10, shared=True, now=time)
    shared.observe("s", "chat", [])
    time.now += 5000
    seen = shared.observe("s", "chat", [])
    assert seen is not None and not seen.cold
    off = PromptClock(PromptCacheSettings(enabled=False), max_sessions=10, now=time)
    assert off.observe("s", "chat", []) is None


def test_the_clock_forgets_the_oldest_sessions_beyond_its_bound() -> None:
    time = FakeTime()
    clock = PromptClock(PromptCacheSettings(), max_sessions=2, now=time)
    for session in ("a", "b", "c"):
        clock.observe(session, "chat", [])
    time.now += 1000
    forgotten = clock.observe("a", "chat", [])
    assert forgotten is not None and forgotten.idle_seconds is None
    kept = clock.observe("c", "chat", [])
    assert kept is not None and kept.cold


def test_a_models_own_prices_set_its_cache_shares() -> None:
    """gpt-4.1 at $2 input and $0.50 cached reads at a quarter; a model the table prices not
    keeps its door's default."""
    models = {
        "default": ModelSettings(window=128_000),
        "gpt-4.1*": ModelSettings(input_price=2.0, cached_input_price=0.5),
        "claude-*": ModelSettings(input_price=3.0, cached_input_price=0.3, cache_write_price=3.75),
    }
    clock = PromptClock(
        PromptCacheSettings(), max_sessions=10, now=FakeTime(), model_shares=cache_price_shares(models)
    )
    priced = clock.observe("a", "chat", [], "gpt-4.1-mini")
    assert priced is not None and (priced.read_price, priced.write_price) == (0.25, 1.0)
    claude = clock.observe("c", "anthropic", [], "claude-sonnet-4")
    assert claude is not None and claude.read_price == pytest.approx(0.1)
    assert claude.write_price == pytest.approx(1.25)
    unpriced = clock.observe("u", "chat", [], "local-coder")
    assert unpriced is not None and unpriced.read_price == 0.5
