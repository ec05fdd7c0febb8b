"""``compaction-proxy wrap`` as a user runs it: one command starts a proxy for the run, points
the agent at it, names the run's session, passes the agent's exit status on, prints what the
proxy did, and stops the proxy. With the real Claude Code and Codex CLIs against the fake
providers, and with any other command (it gets the base-URL variables SDKs read)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.anthropic_upstream import DONE_PREFIX, AnthropicUpstream
from tests.e2e.clients.anthropic_fake_helpers import started_fakes
from tests.e2e.clients.claude_code import API_KEY as CLAUDE_KEY
from tests.e2e.clients.claude_code import CLAUDE_MODEL, claude_binary, claude_env
from tests.e2e.clients.responses.codex_cli import CODEX_MODEL, codex_binary, codex_config
from tests.e2e.clients.responses.runs import started_upstreams, task
from tests.e2e.test_read_tool_output import history
from tests.fake_upstream import FakeUpstream, Reply, completion, free_port
from tests.needs import agent_cli_unavailable
from tests.responses_upstream import DONE_PREFIX as CODEX_DONE
from tests.responses_upstream import ResponsesUpstream

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
WRAP_TIMEOUT = 180


def wrap(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "proxy.cli", "wrap", *argv]
    # A proxy started for the run works under XDG_STATE_HOME: the test's own directory.
    environment = {"XDG_STATE_HOME": str(cwd / "state-home"), **env, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        command,
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=WRAP_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )


def write_config(tmp_path: Path, settings: dict[str, Any], *, state_dir: bool = True) -> Path:
    config = tmp_path / "wrap.yml"
    # The configured address holds no proxy: wrap starts one for the run (on a free port).
    base: dict[str, Any] = {
        "server": {"port": free_port()},
        "state_dir": str(tmp_path / "state"),
        "logging": {"level": "warning"},
    }
    if not state_dir:
        del base["state_dir"]  # the default, ./var
    config.write_text(json.dumps({**base, **settings}))
    return config


def scratch(tmp_path: Path, agent: str) -> tuple[Path, Path]:
    """The agent's own home (its settings and session files) and its working directory."""
    home, work = tmp_path / f"{agent}-home", tmp_path / f"{agent}-work"
    home.mkdir()
    work.mkdir()
    return home, work


def summary_of(stderr: str) -> dict[str, Any]:
    last = [line for line in stderr.strip().splitlines() if line.startswith("{")][-1]
    found: dict[str, Any] = json.loads(last)
    return found


AGENT_SCRIPT = """
import os, sys, openai
key = "sk-wrap-0000000000000000"
client = openai.OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=key, max_retries=0)
messages = json.loads(sys.argv[1])
for turn in range(2):
    answer = client.chat.completions.create(model="gpt-4o", messages=messages)
    said = answer.choices[0].message.content
    messages += [{"role": "assistant", "content": said}, {"role": "user", "content": "Go on."}]
print("agent done", os.environ["COMPACTION_PROXY_SESSION"])
sys.exit(3)
"""


def test_any_command_runs_through_a_proxy_started_for_the_run(upstream: FakeUpstream, tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        {
            "policy": "improved",
            "context_windows": {"default": 8192},
            "upstream": {"base_url": upstream.base_url},
        },
    )
    upstream.queue(Reply(body=completion("first")), Reply(body=completion("second")))
    script = "import json\n" + AGENT_SCRIPT
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    ran = wrap(
        ["--config", str(config), "--json", sys.executable, "--", "-c", script, json.dumps(history())],
        env,
        tmp_path,
    )
    assert ran.returncode == 3, ran.stderr  # the agent's own exit status
    assert ran.stdout.startswith("agent done wrap-"), ran.stdout
    summary = summary_of(ran.stderr)
    assert summary["requests"] == 2 and summary["compaction_points"] >= 1
    assert summary["tokens_after"] < summary["tokens_before"] and summary["tokens_saved"] > 0
    assert summary["shared_proxy"] is False and Path(summary["proxy_log"]).exists()
    assert ran.stdout.split()[-1] == summary["session"]
    assert summary["policies"] == ["improved/enforce"] and summary["models"] == {"gpt-4o": 2}
    assert summary["windows"] == {"gpt-4o": 8192} and summary["errors"] == 0
    # The proxy it started is stopped.
    with pytest.raises(httpx.HTTPError):
        httpx.get(summary["proxy_url"] + "/readyz", timeout=2)
    assert len(upstream.requests) == 2
    # A plain SDK script sends no session header: its base URL carried the run's session.
    assert {r.headers.get("x-session-id") for r in upstream.requests} == {summary["session"]}


def test_the_summary_in_words_says_when_nothing_was_compacted(upstream: FakeUpstream, tmp_path: Path) -> None:
    settings = {"policy": "improved", "upstream": {"base_url": upstream.base_url}}
    config = write_config(tmp_path, settings, state_dir=False)
    upstream.queue(Reply(body=completion("hello")))
    script = (
        "import os, openai\n"
        "c = openai.OpenAI(base_url=os.environ['OPENAI_BASE_URL'], api_key='sk-x', max_retries=0)\n"
        "c.chat.completions.create(model='gpt-4o', messages=[{'role': 'user', 'content': 'hi'}])"
    )
    ran = wrap(
        ["--config", str(config), sys.executable, "--", "-c", script], {"PATH": os.environ["PATH"]}, tmp_path
    )
    assert ran.returncode == 0, ran.stderr
    assert "compaction-proxy: 1 requests in session wrap-" in ran.stderr
    assert ", policy improved/enforce" in ran.stderr and "windows: gpt-4o 128,000 tokens" in ran.stderr
    assert "nothing was compacted: every request stayed under improved/enforce's trigger" in ran.stderr
    assert "proxy log: " in ran.stderr and "events: compaction-proxy events --session wrap-" in ran.stderr
    # The default state directory (./var) is the proxy's working directory's, not the agent's.
    assert not (tmp_path / "var").exists()
    assert (tmp_path / "state-home" / "compaction-proxy" / "wrap" / "var" / "compaction.db").exists()


def test_a_url_where_no_proxy_answers_is_one_line(tmp_path: Path) -> None:
    ran = wrap(["--url", f"http://127.0.0.1:{free_port()}", "true"], {"PATH": os.environ["PATH"]}, tmp_path)
    assert ran.returncode == 1 and ran.stderr.strip().startswith("compaction-proxy: no proxy answers at")


@pytest.fixture
def fake() -> Iterator[Callable[..., AnthropicUpstream]]:
    yield from started_fakes()


@pytest.fixture
def responses_upstream() -> Iterator[Callable[..., ResponsesUpstream]]:
    yield from started_upstreams()


def test_claude_code_runs_through_wrap(fake: Callable[..., AnthropicUpstream], tmp_path: Path) -> None:
    binary = claude_binary()
    if binary is None:
        agent_cli_unavailable("Claude Code", "@anthropic-ai/claude-code")
    server = fake(steps=3)
    config = write_config(
        tmp_path,
        {
            "policy": "improved",
            "context_windows": {"default": 200000},
            "anthropic": {"base_url": server.base_url},
        },
    )
    home, work = scratch(tmp_path, "claude")
    env = claude_env("unused", home, api_key=CLAUDE_KEY)
    del env["ANTHROPIC_BASE_URL"]  # wrap sets it
    args = ["-p", "Run the scripted checks one by one with Bash, then report."]
    args += ["--dangerously-skip-permissions", "--model", CLAUDE_MODEL, "--output-format", "json"]
    ran = wrap(["--config", str(config), "--json", str(binary), "--", *args], env, work)
    assert ran.returncode == 0, ran.stderr[-3000:]
    result = json.loads(ran.stdout)
    assert result["result"] == f"{DONE_PREFIX} completed 3 steps", ran.stdout
    summary = summary_of(ran.stderr)
    assert summary["requests"] == len(server.requests) >= 4
    assert summary["tokens_before"] > 25_000  # its system prompt and tools, counted by the proxy
    # Every request carried the run's session, as the proxy reads it.
    assert {r.headers.get("x-session-id") for r in server.requests} == {summary["session"]}


def test_codex_runs_through_wrap(
    responses_upstream: Callable[..., ResponsesUpstream], tmp_path: Path
) -> None:
    binary = codex_binary()
    if binary is None:
        agent_cli_unavailable("Codex CLI", "@openai/codex")
    server = responses_upstream(window=16_000, steps=3)
    config = write_config(
        tmp_path,
        {
            "policy": "improved",
            "context_windows": {"default": 16_000},
            "upstream": {"base_url": server.base_url},
        },
    )
    home, work = scratch(tmp_path, "codex")
    # The user's own Codex settings (no network at start); wrap adds its provider with -c.
    (home / "config.toml").write_text(
        codex_config("http://127.0.0.1:9/unused", context_window=1_000_000, auto_compact=None, retries=False)
    )
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "CODEX_HOME": str(home),
        "OPENAI_API_KEY": "sk-codex-wrap-000000000000",
        "RUST_LOG": "warn",
        "NO_COLOR": "1",
        "TERM": "dumb",
    }
    last = tmp_path / "last.txt"
    args = ["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "--color", "never"]
    args += ["-o", str(last), "-m", CODEX_MODEL, task("codex", 3)]
    ran = wrap(["--config", str(config), "--json", str(binary), "--", *args], env, work)
    assert ran.returncode == 0, f"{ran.stderr[-3000:]}\n{server.summary()}"
    assert last.read_text().strip().startswith(CODEX_DONE), last.read_text()
    summary = summary_of(ran.stderr)
    # The proxy compacted at this window, and the model read saved outputs back: read rounds
    # are upstream requests of their own, not the agent's.
    assert 4 <= summary["requests"] < len(server.requests)
    assert summary["compaction_points"] >= 1 and summary["reads"] >= 1
    assert summary["tokens_after"] < summary["tokens_before"]
    assert {r.headers.get("x-session-id") for r in server.requests} == {summary["session"]}
