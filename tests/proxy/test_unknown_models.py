"""A model no pattern of the ``models`` table covers is never silent: it is logged and counted
once per name when it first comes, and ``check-config`` names the configured upstreams' usual
models that would fall to the default window before any traffic does."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
import yaml

from proxy.app import create_app
from proxy.cli import main
from proxy.commands.model_coverage import uncovered_models
from proxy.config.settings import load_settings
from tests.recording_logger import RecordingLogger


def completion(_request: httpx.Request) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "id": "c",
            "object": "chat.completion",
            "model": "m",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
            ],
        },
    )


def test_an_unmatched_model_is_logged_and_counted_once(tmp_path: Path) -> None:
    settings = load_settings(
        env={}, overrides={"upstream.base_url": "http://upstream.test/v1", "state_dir": str(tmp_path)}
    )
    logger = RecordingLogger()
    app = create_app(settings, logger=logger, transport=httpx.MockTransport(completion))

    async def run() -> str:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost"
        ) as client:
            for model in ("my-local-llm", "my-local-llm", "gpt-4o-mini"):
                body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
                answered = await client.post("/v1/chat/completions", json=body)
                assert answered.status_code == 200
            return (await client.get("/metrics")).text

    metrics = asyncio.run(run())
    told = [r for r in logger.records if r["event"] == "model_window_defaulted"]
    assert [(r["model"], r["window"]) for r in told] == [("my-local-llm", 128_000)]
    assert 'compaction_proxy_model_window_defaulted_total{model="my-local-llm"} 1.0' in metrics
    assert 'compaction_proxy_model_window_defaulted_total{model="gpt-4o-mini"}' not in metrics


def test_uncovered_models_name_the_usual_names_without_a_pattern() -> None:
    windows = {"gpt-4o*": 128_000, "claude-*": 200_000, "default": 32_000}
    lines = uncovered_models(windows, ["https://api.openai.com/v1", "https://api.anthropic.com"])
    assert lines[0].startswith("api.openai.com: not covered, so given the default window (32000): gpt-4.1,")
    assert "gpt-4o-mini" not in lines[0] and "o4-mini" in lines[0]
    assert lines[1] == "api.anthropic.com: every usual model name has a pattern"
    local = uncovered_models(windows, ["http://127.0.0.1:8080/v1"])
    assert local == [
        "127.0.0.1: its model names are not known here; add each model your agents use to `models:` "
        "(unmatched names get the default window, 32000)"
    ]


def test_check_config_lists_what_the_models_table_leaves_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump({"state_dir": str(tmp_path), "models": {"gpt-4o*": {"window": 128000}}}))
    assert main(["check-config", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "# models table against the configured upstreams' usual model names:" in out
    # The user's table adds to the built-in one: the built-in patterns still cover these.
    assert "#   api.openai.com: every usual model name has a pattern" in out
    assert "#   api.anthropic.com: every usual model name has a pattern" in out
