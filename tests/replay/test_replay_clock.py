"""Simulated time in a replay (``cache.idle``): each step's time, pauses the same for every arm,
cached prefixes expiring after ``ttl_seconds`` of it, and the proxy told to read its clock from
each request."""

from __future__ import annotations

import itertools
from pathlib import Path

from proxy.config.settings import load_settings
from replay.config import IdleModel, ReplayConfig, load_replay_config
from replay.session.clock import pauses_after, step_times
from replay.session.cost import RequestShape, simulate
from replay.session.proxy_process import replay_proxy_config


def test_steps_come_step_seconds_apart_without_pauses() -> None:
    assert step_times("case", [3, 5, 9], IdleModel(step_seconds=20)) == [0.0, 20.0, 40.0]


def test_pauses_are_a_share_of_steps_chosen_by_case_and_step() -> None:
    idle = IdleModel(step_seconds=10, pause_share=0.25, pause_seconds=900)
    steps = list(range(2, 402, 2))
    times = step_times("case-a", steps, idle)
    paused = sum(1 for a, b in itertools.pairwise(times) if b - a > 10)
    assert 30 <= paused <= 70  # about a quarter of 199 gaps
    assert times == step_times("case-a", steps, idle)  # every arm meets the same pauses
    assert times != step_times("case-b", steps, idle)
    assert not any(pauses_after("case-a", s, 0.0) for s in steps)


def expiring(at: list[float]) -> list[RequestShape]:
    """The same growing prefix requested at the times ``at``."""
    return [
        RequestShape("step", tuple(range(k + 2)), tuple([1500] * (k + 2)), at=t) for k, t in enumerate(at)
    ]


def test_a_prefix_unused_longer_than_the_lifetime_is_a_miss() -> None:
    for rule in ("openai", "anthropic"):
        billed = simulate(expiring([0, 20, 40, 1000, 1020]), rule, ttl=300)
        hits = [b.cached > 0 for b in billed if b is not None]
        assert hits == [False, True, True, False, True], rule
        # Without the clock (every request at 0) nothing expires.
        timeless = simulate(expiring([0, 0, 0, 0, 0]), rule, ttl=300)
        assert all(b.cached > 0 for b in timeless[1:] if b is not None)


def test_the_shapes_keep_their_time_through_json() -> None:
    shape = RequestShape("step", (1, 2), (10, 20), at=42.5)
    assert RequestShape.from_json(shape.to_json()) == shape


def test_the_replays_proxy_reads_its_clock_from_each_request(tmp_path: Path) -> None:
    config = load_replay_config(None, {"cache": {"ttl_seconds": 600, "idle": {"pause_share": 0.1}}})
    assert isinstance(config, ReplayConfig) and config.cache.idle.pause_share == 0.1
    data = replay_proxy_config(load_settings(None, env={}), config, "http://127.0.0.1:9/v1", tmp_path)
    assert data["prompt_cache"]["clock"] == "request"
    # gpt-4o (the replay's default model) bills cached input at half price.
    assert data["prompt_cache"]["openai"] == {"ttl_seconds": 600, "read_price": 0.5, "write_price": 1.0}
