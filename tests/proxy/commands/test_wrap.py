"""How ``wrap`` points each agent at the proxy, and how it reads what the proxy did."""

from __future__ import annotations

from pathlib import Path

from proxy.commands.wrap import Figures, Proxy, agent_command, agent_environment, parse_figures, summary_lines
from proxy.telemetry.metrics import Metrics

BASE = "http://127.0.0.1:9999"


def test_claude_code_gets_the_base_url_and_the_session_header_beside_its_own() -> None:
    env = agent_environment(
        "/opt/bin/claude", BASE, "wrap-1", {"ANTHROPIC_API_KEY": "k", "ANTHROPIC_CUSTOM_HEADERS": "x-team: a"}
    )
    assert env["ANTHROPIC_BASE_URL"] == BASE and env["ANTHROPIC_API_KEY"] == "k"
    assert env["ANTHROPIC_CUSTOM_HEADERS"] == "x-team: a\nx-session-id: wrap-1"
    assert "OPENAI_BASE_URL" not in env


def test_codex_gets_a_provider_of_its_own_on_the_command_line() -> None:
    command = agent_command("codex", ["exec", "fix it"], BASE, "wrap-1")
    assert command[:2] == ["codex", "-c"] and command[2] == 'model_provider="compaction-proxy"'
    provider = command[4]
    assert provider.startswith("model_providers.compaction-proxy={")
    assert f'base_url="{BASE}/v1"' in provider and 'wire_api="responses"' in provider
    assert 'http_headers={"x-session-id"="wrap-1"}' in provider
    assert command[5:] == ["exec", "fix it"]
    # Its environment is left as the user set it (the key it reads included).
    assert agent_environment("codex", BASE, "wrap-1", {"OPENAI_API_KEY": "k"}) == {
        "OPENAI_API_KEY": "k",
        "COMPACTION_PROXY_SESSION": "wrap-1",
    }


def test_any_other_command_gets_the_variables_sdks_read() -> None:
    env = agent_environment("aider", BASE, "wrap-1", {})
    assert env["OPENAI_BASE_URL"] == env["OPENAI_API_BASE"] == f"{BASE}/v1"
    assert env["ANTHROPIC_BASE_URL"] == BASE
    assert agent_command("aider", ["--yes"], BASE, "wrap-1") == ["aider", "--yes"]


def test_figures_are_read_from_the_proxys_own_metrics() -> None:
    metrics = Metrics()
    metrics.requests.labels("chat", "improved", "enforce", "2xx").inc(3)
    metrics.requests.labels("anthropic", "improved", "enforce", "4xx").inc()
    metrics.tokens_before.labels("improved", "enforce").observe(10_000)
    metrics.tokens_after.labels("improved", "enforce").observe(4_000)
    metrics.compaction_points.labels("improved", "threshold").inc()
    metrics.compactions.labels("improved", "offload", "threshold").inc()
    metrics.compactions.labels("improved", "summarize", "threshold").inc()
    metrics.reads.labels("ok").inc(2)
    figures = parse_figures(metrics.render().decode())
    assert figures == Figures(
        requests=4, tokens_before=10_000, tokens_after=4_000, compaction_points=1, reads=2, errors=0
    )
    assert figures.minus(Figures(requests=1, tokens_before=1_000)).requests == 3


def test_the_summary_says_what_was_saved_and_where_the_log_is() -> None:
    figures = Figures(requests=4, tokens_before=10_000, tokens_after=4_000, compaction_points=1, reads=2)
    proxy = Proxy(BASE, log_path=Path("/tmp/proxy.log"))
    lines = summary_lines(figures, session="wrap-1", log_path=proxy.log_path, shared=False)
    assert lines == [
        "compaction-proxy: 4 requests in session wrap-1",
        "  prompt tokens: 10,000 sent by the agent, 4,000 upstream",
        "  saved: 6,000 prompt tokens (60%)",
        "  compaction points: 1, saved outputs read back: 2",
        "  proxy log: /tmp/proxy.log",
    ]
    shared = summary_lines(Figures(requests=1), session="s", log_path=None, shared=True)
    assert "  nothing was compacted: the run stayed under the policy's trigger" in shared
    assert shared[-1].startswith("  (a proxy that was already running")
