"""Token factors for models without a packaged tokenizer: the default, calibration from reported
usage (fixed tool prompt taken off, small and absurd samples ignored, bounded), persistence, and
the window in the proxy's count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.state.token_factors import ScaledWindows, TokenFactors


def test_only_configured_models_have_a_factor() -> None:
    factors = TokenFactors({"claude-*": 1.3})
    assert factors.factor("claude-sonnet-4-6") == 1.3 and factors.fixed_for("claude-sonnet-4-6") == 346
    assert factors.factor("gpt-4o") == 1.0 and factors.fixed_for("gpt-4o") == 0
    assert factors.observe("gpt-4o", 10_000, 12_000) is None  # never calibrated


def test_calibration_takes_the_90th_percentile_plus_the_margin() -> None:
    factors = TokenFactors({"claude-*": 1.3})
    model = "claude-opus-4-7"
    assert factors.observe(model, 500, 700) is None  # too small: fixed overheads dominate
    assert factors.observe(model, 10_000, 200_000) is None  # not a tokenizer difference
    for reported in (11_346, 11_546, 11_146):  # ratios 1.10, 1.12, 1.08 once the 346 are off
        factors.observe(model, 10_000, reported)
    assert factors.factor(model) == pytest.approx(1.12 * 1.02)
    assert factors.estimate(model, 10_000) == round(10_000 * 1.12 * 1.02) + 346
    assert factors.estimate(model, 10_000, tools=False) == round(10_000 * 1.12 * 1.02)
    # Without tools, nothing is taken off.
    factors.observe("claude-haiku-4-5", 10_000, 11_000, tools=False)
    assert factors.snapshot()["claude-haiku-4-5"]["last_ratio"] == 1.1


def test_samples_and_models_are_bounded() -> None:
    factors = TokenFactors({"claude-*": 1.3}, max_models=2, samples=4)
    for name in ("claude-a", "claude-b", "claude-c"):
        for _ in range(6):
            factors.observe(name, 10_000, 12_346)
    assert set(factors.snapshot()) == {"claude-b", "claude-c"}
    assert factors.snapshot()["claude-c"]["samples"] == 4


def test_the_samples_survive_a_restart_and_bad_files_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "token_factors.json"
    factors = TokenFactors({"claude-*": 1.3}, path=path)
    for _ in range(3):
        factors.observe("claude-x", 10_000, 11_346)
    factors.save()
    assert path.stat().st_mode & 0o777 == 0o600
    again = TokenFactors({"claude-*": 1.3}, path=path)
    again.load()
    assert again.factor("claude-x") == pytest.approx(1.1 * 1.02)
    path.write_text(json.dumps({"ratios": {"claude-x": ["x", 99], "gpt-4o": [1.0]}}))
    broken = TokenFactors({"claude-*": 1.3}, path=path)
    broken.load()
    assert broken.factor("claude-x") == 1.3 and broken.snapshot() == {}
    path.write_text("{not json")
    TokenFactors({"claude-*": 1.3}, path=path).load()  # no error


def test_the_window_is_in_the_proxys_count() -> None:
    factors = TokenFactors({"claude-*": 1.25})
    windows = ScaledWindows({"claude-*": 200_000, "default": 128_000}, factors)
    assert windows.window_for("claude-sonnet-4-6") == int((200_000 - 346) / 1.25)
    assert windows.real_window("claude-sonnet-4-6") == 200_000
    assert windows.window_for("gpt-4o") == 128_000


def test_the_observer_learns_from_answers_but_not_from_estimated_media() -> None:
    import orjson

    from policies.pipeline import PolicyOutcome
    from proxy.dialects import make_dialects
    from proxy.observe.observers import TokenCalibration
    from proxy.telemetry.exchange import Exchange

    factors = TokenFactors({"claude-*": 1.3})
    observer = TokenCalibration(factors, make_dialects())

    def answered(reported: int, media: int = 0) -> Exchange:
        exchange = Exchange(request_id="r", route="anthropic", method="POST", started=0.0, status=200)
        exchange.mode, exchange.model, exchange.token_factor = "enforce", "claude-x", 1.3
        exchange.outcome = PolicyOutcome(None, 10_000, 10_000)
        exchange.dialect_notes = {"tools": 1, **({"media": media} if media else {})}
        exchange.answer_head = bytearray(
            orjson.dumps({"type": "message", "usage": {"input_tokens": reported}})
        )
        observer.finish(exchange)
        return exchange

    assert answered(30_346, media=4).token_count["ratio"] is None  # type: ignore[index]
    assert factors.snapshot() == {}
    counted = answered(11_346).token_count
    assert counted == {
        "counted": 10_000,
        "factor": 1.3,
        "fixed": 346,
        "estimated": 13_346,
        "reported": 11_346,
        "ratio": 1.1,
    }


def test_one_tenant_cannot_steer_the_factor_others_are_counted_with(tmp_path: Path) -> None:
    """Three tenants report ratios near 1.2; a fourth floods the model with 1.6: the factor
    stays where the others put it (the median of each tenant's 90th percentile)."""
    factors = TokenFactors({"claude-*": 1.3}, path=tmp_path / "factors.json")
    for tenant in ("t_a", "t_b", "t_c"):
        for ratio in (1.19, 1.2, 1.21, 1.2):
            factors.observe("claude-x", 10_000, round(10_000 * ratio), tools=False, tenant=tenant)
    steady = factors.factor("claude-x")
    assert 1.2 < steady < 1.25
    for _ in range(500):
        factors.observe("claude-x", 10_000, 16_000, tools=False, tenant="t_hostile")
    assert factors.factor("claude-x") == pytest.approx(steady, abs=0.01)
    # Samples survive a restart per tenant, and so does the factor.
    factors.save()
    again = TokenFactors({"claude-*": 1.3}, path=tmp_path / "factors.json")
    again.load()
    assert again.factor("claude-x") == pytest.approx(steady, abs=0.01)
    assert again.snapshot()["claude-x"]["tenants"] == 4


def test_a_file_from_before_per_tenant_samples_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "factors.json"
    path.write_text(json.dumps({"ratios": {"claude-x": [1.4, 1.41, 1.39, 1.4]}}))
    factors = TokenFactors({"claude-*": 1.3}, path=path)
    factors.load()
    assert factors.factor("claude-x") == pytest.approx(1.41 * 1.02, abs=0.01)
