"""The proxy's clock of each session's prefix: the time since its previous request, by the
wall clock or a replay's ``X-Compaction-Clock``, the door's provider cache, never cold when
replicas share the sessions, bounded."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from proxy.config.prompt_cache import PromptCacheSettings
from proxy.config.sections import ModelSettings
from proxy.state.prompt_clock import PromptClock
from proxy.state.sqlite_store import SQLiteStore
from proxy.telemetry.session_summary import cache_price_shares


def observe(clock: PromptClock, session: str, door: str, headers: Any, model: object = None) -> Any:
    return asyncio.run(clock.observe("t_a", session, door, headers, model))


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_wall_clock_tells_a_session_back_after_the_lifetime_it_is_cold() -> None:
    time = FakeTime()
    clock = PromptClock(PromptCacheSettings(), max_sessions=10, now=time)
    first = observe(clock, "s", "chat", [])
    assert first is not None and first.idle_seconds is None and not first.cold
    time.now += 20
    warm = observe(clock, "s", "chat", [])
    assert warm is not None and warm.idle_seconds == 20 and not warm.cold
    time.now += 301
    cold = observe(clock, "s", "chat", [])
    assert cold is not None and cold.cold
    # Another session has its own time.
    other = observe(clock, "t", "chat", [])
    assert other is not None and other.idle_seconds is None


def test_each_door_has_its_providers_cache() -> None:
    clock = PromptClock(PromptCacheSettings(), max_sessions=10, now=FakeTime())
    anthropic = observe(clock, "a", "anthropic", [])
    gemini = observe(clock, "g", "code_assist", [])
    openai = observe(clock, "o", "responses", [])
    assert anthropic is not None and (anthropic.read_price, anthropic.write_price) == (0.1, 1.25)
    assert gemini is not None and gemini.read_price == 0.25
    assert openai is not None and (openai.read_price, openai.write_price) == (0.5, 1.0)


def test_the_request_clock_reads_the_header_and_without_it_is_time_blind() -> None:
    clock = PromptClock(PromptCacheSettings(clock="request"), max_sessions=10)
    assert observe(clock, "s", "chat", []) is None
    assert observe(clock, "s", "chat", [(b"x-compaction-clock", b"nonsense")]) is None
    assert observe(clock, "s", "chat", [(b"x-compaction-clock", b"nan")]) is None
    observe(clock, "s", "chat", [(b"x-compaction-clock", b"10")])
    later = observe(clock, "s", "chat", [(b"x-compaction-clock", b"920.5")])
    assert later is not None and later.idle_seconds == 910.5 and later.cold


def test_processes_sharing_a_store_share_each_sessions_last_send(tmp_path: Path) -> None:
    """Two processes on one store: the second sees the first's send (another tenant's session
    of the same name is not it); a store that fails makes the request time-blind."""
    store = SQLiteStore(tmp_path / "s.db")
    time = FakeTime()
    first = PromptClock(PromptCacheSettings(), max_sessions=10, shared=store, now=time)
    second = PromptClock(PromptCacheSettings(), max_sessions=10, shared=store, now=time)
    found = observe(first, "s", "chat", [])
    assert found is not None and found.idle_seconds is None
    time.now += 900
    back = observe(second, "s", "chat", [])
    assert back is not None and back.idle_seconds == 900 and back.cold
    other = asyncio.run(second.observe("t_b", "s", "chat", []))
    assert other is not None and other.idle_seconds is None

    class Broken:
        async def swap_sent_at(self, tenant: str, session: str, at: float) -> float | None:
            raise OSError("down")

    broken = PromptClock(PromptCacheSettings(), max_sessions=10, shared=Broken(), now=time)  # type: ignore[arg-type]
    assert observe(broken, "s", "chat", []) is None
    asyncio.run(store.close())


def test_disabled_is_time_blind() -> None:
    off = PromptClock(PromptCacheSettings(enabled=False), max_sessions=10, now=FakeTime())
    assert observe(off, "s", "chat", []) is None


def test_the_clock_forgets_the_oldest_sessions_beyond_its_bound() -> None:
    time = FakeTime()
    clock = PromptClock(PromptCacheSettings(), max_sessions=2, now=time)
    for session in ("a", "b", "c"):
        observe(clock, session, "chat", [])
    time.now += 1000
    forgotten = observe(clock, "a", "chat", [])
    assert forgotten is not None and forgotten.idle_seconds is None
    kept = observe(clock, "c", "chat", [])
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
    priced = observe(clock, "a", "chat", [], "gpt-4.1-mini")
    assert priced is not None and (priced.read_price, priced.write_price) == (0.25, 1.0)
    claude = observe(clock, "c", "anthropic", [], "claude-sonnet-4")
    assert claude is not None and claude.read_price == pytest.approx(0.1)
    assert claude.write_price == pytest.approx(1.25)
    unpriced = observe(clock, "u", "chat", [], "local-coder")
    assert unpriced is not None and unpriced.read_price == 0.5


def test_workers_on_one_sqlite_file_take_no_session_for_cold() -> None:
    time = FakeTime()
    clock = PromptClock(PromptCacheSettings(), max_sessions=10, now=time, unshared_peers=True)
    observe(clock, "s", "chat", [])
    time.now += 5000
    seen = observe(clock, "s", "chat", [])
    assert seen is not None and not seen.cold
