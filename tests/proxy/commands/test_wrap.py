"""How ``wrap`` points each agent at the proxy, reads what the proxy did, and says it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.commands.wrap_agents import agent_wiring
from proxy.commands.wrap_runs import record_run, run_settings
from proxy.commands.wrap_signals import shell_status
from proxy.commands.wrap_summary import Figures, RunFacts, parse_figures, summary_json, summary_lines
from proxy.config.settings import load_settings, settings_digest
from proxy.telemetry.metrics import Metrics

BASE = "http://127.0.0.1:9999"
ROOT = f"{BASE}/s/wrap-1"


def wired(
    agent: str, env: dict[str, str] | None = None, args: list[str] | None = None
) -> tuple[dict[str, str], list[str]]:
    return agent_wiring(agent, args or [], BASE, "wrap-1", env or {})


def test_claude_code_gets_the_session_base_url_without_v1_and_its_headers_untouched() -> None:
    env, command = wired(
        "/opt/bin/claude", {"ANTHROPIC_API_KEY": "k", "ANTHROPIC_CUSTOM_HEADERS": "x-team: a"}
    )
    assert env["ANTHROPIC_BASE_URL"] == ROOT and env["ANTHROPIC_API_KEY"] == "k"
    assert env["ANTHROPIC_CUSTOM_HEADERS"] == "x-team: a" and env["COMPACTION_PROXY_SESSION"] == "wrap-1"
    assert "OPENAI_BASE_URL" not in env and command == ["/opt/bin/claude"]


def test_codex_gets_a_provider_of_its_own_on_the_command_line() -> None:
    env, command = wired("codex", {"OPENAI_API_KEY": "k"}, ["exec", "fix it"])
    assert command[:3] == ["codex", "-c", 'model_provider="compaction-proxy"']
    provider = command[4]
    assert provider.startswith("model_providers.compaction-proxy={")
    assert f'base_url="{ROOT}/v1"' in provider and 'wire_api="responses"' in provider
    assert command[5:] == ["exec", "fix it"]
    # Its environment is left as the user set it (the key it reads included).
    assert env == {"OPENAI_API_KEY": "k", "COMPACTION_PROXY_SESSION": "wrap-1"}


def test_any_other_command_gets_the_variables_sdks_read_with_the_session_in_the_path() -> None:
    env, command = wired("python3", args=["agent.py"])
    assert env["OPENAI_BASE_URL"] == env["OPENAI_API_BASE"] == f"{ROOT}/v1"
    assert env["ANTHROPIC_BASE_URL"] == env["ANTHROPIC_API_BASE"] == ROOT
    assert command == ["python3", "agent.py"]


def test_opencode_gets_inline_configuration_over_its_files_keeping_the_users() -> None:
    own = json.dumps({"model": "openai/gpt-4o", "provider": {"openai": {"options": {"timeout": 5}}}})
    env, command = wired("opencode", {"OPENCODE_CONFIG_CONTENT": own}, ["run", "hi"])
    inline = json.loads(env["OPENCODE_CONFIG_CONTENT"])
    assert inline["model"] == "openai/gpt-4o"
    assert inline["provider"]["openai"]["options"] == {"timeout": 5, "baseURL": f"{ROOT}/v1"}
    assert inline["provider"]["anthropic"]["options"] == {"baseURL": f"{ROOT}/v1"}
    assert command == ["opencode", "run", "hi"]


def test_aider_qwen_and_goose_are_pointed_their_own_way() -> None:
    env, command = wired("aider", args=["--model", "openai/gpt-4o"])
    assert env["AIDER_OPENAI_API_BASE"] == env["OPENAI_API_BASE"] == f"{ROOT}/v1"
    assert command == ["aider", "--model", "openai/gpt-4o"]
    env, command = wired("qwen", args=["-p", "hi"])
    assert env["OPENAI_BASE_URL"] == f"{ROOT}/v1"
    assert command == ["qwen", "--openai-base-url", f"{ROOT}/v1", "-p", "hi"]
    env, command = wired("goose", {"GOOSE_PROVIDER": "openai"}, ["run", "-t", "hi"])
    assert env["OPENAI_HOST"] == BASE and env["OPENAI_BASE_PATH"] == "s/wrap-1/v1/chat/completions"
    assert env["ANTHROPIC_HOST"] == ROOT and env["GOOSE_PROVIDER"] == "openai"
    assert command == ["goose", "run", "-t", "hi"]


def test_gemini_cli_gets_its_gemini_api_and_code_assist_base_urls() -> None:
    env, command = wired("gemini", {"GEMINI_API_KEY": "k"}, ["-p", "hi", "--yolo"])
    # Its clients append /v1beta/... and /v1internal:... to these, inside the run's session.
    assert env["GOOGLE_GEMINI_BASE_URL"] == env["CODE_ASSIST_ENDPOINT"] == ROOT
    assert env["GEMINI_API_KEY"] == "k" and command == ["gemini", "-p", "hi", "--yolo"]


def test_a_signalled_agents_status_is_128_plus_the_signal() -> None:
    assert shell_status(-15) == 143 and shell_status(-2) == 130 and shell_status(3) == 3


def test_figures_are_read_from_the_proxys_own_metrics() -> None:
    metrics = Metrics()
    metrics.requests.labels("chat", "improved", "enforce", "2xx").inc(3)
    metrics.requests.labels("anthropic", "improved", "enforce", "4xx").inc()
    metrics.model_requests.labels("gpt-4o").inc(4)
    metrics.errors.labels("upstream_timeout").inc()
    metrics.errors.labels("store_write").inc()
    metrics.tokens_before.labels("improved", "enforce").observe(10_000)
    metrics.tokens_after.labels("improved", "enforce").observe(4_000)
    metrics.compaction_points.labels("improved", "threshold").inc()
    metrics.compactions.labels("improved", "offload", "threshold").inc()
    metrics.reads.labels("ok").inc(2)
    figures = parse_figures(metrics.render().decode())
    assert figures == Figures(
        requests=4,
        tokens_before=10_000,
        tokens_after=4_000,
        compaction_points=1,
        reads=2,
        failed_answers={"4xx": 1},
        upstream_failures=1,
        policies={"improved/enforce": 4},
        models={"gpt-4o": 4},
    )
    assert figures.errors == 1
    assert figures.minus(Figures(requests=1, tokens_before=1_000, models={"gpt-4o": 1})).models == {
        "gpt-4o": 3
    }


FACTS = RunFacts(
    session="wrap-1",
    proxy_url=BASE,
    shared=False,
    log_path=Path("/tmp/proxy.log"),
    policy="improved",
    mode="enforce",
    windows={"gpt-4o*": 128_000, "default": 32_000},
    events_command="compaction-proxy events --session wrap-1",
)


def test_the_summary_names_the_policy_the_windows_and_where_to_look() -> None:
    figures = Figures(
        requests=4,
        tokens_before=10_000,
        tokens_after=4_000,
        compaction_points=1,
        reads=2,
        policies={"improved/enforce": 4},
        models={"gpt-4o-mini": 3, "local-model": 1},
    )
    assert summary_lines(figures, FACTS) == [
        "compaction-proxy: 4 requests in session wrap-1, policy improved/enforce",
        "  windows: gpt-4o-mini 128,000 tokens, local-model 32,000 tokens",
        "  prompt tokens: 10,000 sent by the agent, 4,000 upstream",
        "  saved: 6,000 prompt tokens (60%)",
        "  compaction points: 1, saved outputs read back: 2",
        "  proxy log: /tmp/proxy.log",
        "  events: compaction-proxy events --session wrap-1",
    ]
    quiet = summary_lines(Figures(requests=1, policies={"improved/enforce": 1}), FACTS)
    assert "  nothing was compacted: every request stayed under improved/enforce's trigger" in quiet


def test_the_summary_says_when_the_agent_sent_nothing() -> None:
    lines = summary_lines(Figures(), FACTS)
    assert lines[0].startswith("compaction-proxy: the agent sent no request to the proxy in session wrap-1")
    assert "not pointed at it" in lines[0] and not any("nothing was compacted" in line for line in lines)
    assert json.loads(summary_json(Figures(), FACTS))["no_requests"] is True


def test_the_summary_counts_errors_and_says_when_every_request_failed() -> None:
    figures = Figures(
        requests=3, failed_answers={"4xx": 3}, policies={"improved/enforce": 3}, models={"m": 3}
    )
    lines = summary_lines(figures, FACTS)
    assert "  errors: 3 of 3 answers were not 2xx (3 4xx), 0 upstream failures (see the proxy's log)" in lines
    assert "  every request failed: nothing reached a model, so nothing could be compacted" in lines
    assert not any("nothing was compacted" in line for line in lines)
    summary = json.loads(summary_json(figures, FACTS))
    assert summary["errors"] == 3 and summary["failed_answers"] == {"4xx": 3}
    assert summary["policies"] == ["improved/enforce"] and summary["windows"] == {"m": 32_000}


def test_the_digest_tells_configurations_apart_and_holds_no_secret() -> None:
    plain = load_settings(env={})
    assert settings_digest(plain) == settings_digest(load_settings(env={}, overrides={"server.port": 9}))
    assert settings_digest(plain) != settings_digest(load_settings(env={}, overrides={"policy": "full"}))
    one = load_settings(env={"COMPACTION_PROXY_UPSTREAM_API_KEY": "sk-one"})
    two = load_settings(env={"COMPACTION_PROXY_UPSTREAM_API_KEY": "sk-two"})
    # A key counts as set or not: no digest can be matched against guessed keys.
    assert settings_digest(one) == settings_digest(two) != settings_digest(plain)


def test_a_wrap_runs_store_is_found_from_its_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"XDG_STATE_HOME": str(tmp_path)}
    home = tmp_path / "compaction-proxy" / "wrap"
    record_run(home, "wrap-20260101-000000-aaaaaa", config=None, proxy_cwd=home, proxy_url=BASE)
    found = run_settings("wrap-20260101-000000-aaaaaa", env)
    assert found is not None
    settings, where = found
    assert settings.state_dir == str(home / "var") and str(home / "var" / "compaction.db") in where
    assert run_settings("wrap-unknown", env) is None and run_settings("mine", env) is None
