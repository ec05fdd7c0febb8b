"""Claude Code (``claude -p``, ``@anthropic-ai/claude-code`` from npm) driven DIRECTLY against the
fake Anthropic Messages API (``tests.anthropic_upstream``), without the proxy: proof that the fake
serves the real client as the real server would, so that the through-the-proxy runs can trust it.

Claude Code completes a multi-step run (its Bash tool really runs each step, its thinking blocks
come back intact, it connects nowhere but the base URL), fails at a small window with its context
error (with its own compaction off, or after compacting by itself), recovers from the failures it
retries (529, 429 with ``retry-after``, a mid-stream ``error`` event, a reset) and reports a refused
key. Skipped without npm, unless ``CPX_REQUIRE_CLIENTS=1`` makes that a failure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.anthropic_upstream import DONE_PREFIX, AnthropicUpstream, Failure, step_output
from tests.e2e.clients.anthropic_fake_helpers import CONTEXT_ERROR, started_fakes
from tests.e2e.clients.claude_code import ClaudeRun, claude_binary, claude_run
from tests.needs import agent_cli_unavailable

pytestmark = pytest.mark.e2e

CLAUDE_TASK = "Run the scripted checks one by one with Bash, then report."


@pytest.fixture
def fake() -> Iterator[Callable[..., AnthropicUpstream]]:
    yield from started_fakes()


@pytest.fixture(scope="session")
def claude() -> Path:
    binary = claude_binary()
    if binary is None:
        agent_cli_unavailable("Claude Code", "@anthropic-ai/claude-code")
    return binary


def _claude_trace(server: AnthropicUpstream, run: ClaudeRun) -> str:
    head = f"exit {run.returncode} in {run.seconds:.1f} s: {run.final[:300]}"
    return f"{head}\n{run.stderr[-1500:]}\n{server.summary()}"


def test_claude_code_completes_a_multi_step_run(
    fake: Callable[..., AnthropicUpstream], claude: Path, tmp_path: Path
) -> None:
    server = fake(steps=4)
    run = claude_run(claude, server.base_url, CLAUDE_TASK, tmp_path, trace_network=True)
    trace = _claude_trace(server, run)
    assert run.returncode == 0 and run.final == f"{DONE_PREFIX} completed 4 steps", trace
    assert [s.kind for s in server.requests] == ["step"] * 4 + ["final"], trace
    assert server.problems == server.thinking_problems == server.leaks == server.merged == [], trace
    assert server.thinking_echoed == 4
    # Its Bash tool really ran each step's command: each output came back whole.
    last = server.requests[-1].body["messages"]
    results = [
        b["content"]
        for m in last
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]
    assert results == [step_output(n) for n in range(1, 5)]
    for seen in server.requests:
        assert seen.path == "/v1/messages?beta=true" and seen.stream and seen.thinking
        assert seen.headers["anthropic-version"] == "2023-06-01" and seen.headers["x-claude-code-session-id"]
        assert "Bash" in seen.tool_names and len(seen.tool_names) > 20
        assert seen.cache_breakpoints[-1].startswith(f"messages[{len(seen.body['messages']) - 1}]")
    assert server.conversation().key.startswith("session:")
    assert 25_000 < server.requests[0].tokens < 40_000  # its own system prompt and tools
    assert [(m, p) for m, p, _ in server.others] == [("HEAD", "/")] and server.count_requests == []
    assert run.connects == []  # nothing but the base URL (when strace is installed)


@pytest.mark.parametrize("own_compaction", [False, True], ids=["compaction-off", "own-compaction"])
def test_claude_code_at_a_small_window_fails_with_the_context_error(
    fake: Callable[..., AnthropicUpstream], claude: Path, tmp_path: Path, own_compaction: bool
) -> None:
    window = 40_000
    server = fake(window=window, steps=10)
    run = claude_run(claude, server.base_url, CLAUDE_TASK, tmp_path, own_compaction=own_compaction)
    trace = _claude_trace(server, run)
    assert run.returncode == 1 and run.is_error, trace
    assert server.rejected and all(CONTEXT_ERROR.fullmatch(s.error) for s in server.rejected), trace
    assert all(s.budget <= window for s in server.requests if s.kind != "rejected")
    # It retried its first refused request with max_tokens lowered to fit.
    assert server.requests[1].max_tokens < server.requests[0].max_tokens == 32_000, trace
    steps = max(s.step for s in server.requests)
    assert steps < 10
    if not own_compaction:
        assert run.final == "Prompt is too long" and run.result and run.result["api_error_status"] == 400, (
            trace
        )
    else:  # it summarized by itself (its compaction request, recognized), and still could not go on
        assert any(s.kind == "summary" for s in server.requests), trace


@pytest.mark.parametrize(
    ("failure", "failures"),
    [
        pytest.param(Failure(status=529), 2, id="529-twice"),
        pytest.param(Failure(status=429, retry_after="1"), 1, id="429-retry-after"),
        pytest.param(Failure("stream_error", after_events=5), 1, id="error-event"),
        pytest.param(Failure("reset", after_events=5), 1, id="reset"),
    ],
)
def test_claude_code_retries_what_the_real_api_asks_it_to(
    fake: Callable[..., AnthropicUpstream], claude: Path, tmp_path: Path, failure: Failure, failures: int
) -> None:
    server = fake(steps=2, fail_request=range(2, 2 + failures), failure=failure)
    run = claude_run(claude, server.base_url, CLAUDE_TASK, tmp_path)
    trace = _claude_trace(server, run)
    assert run.returncode == 0 and run.final == f"{DONE_PREFIX} completed 2 steps", trace
    kinds = [s.kind for s in server.requests]
    assert kinds == ["step", *["failed"] * failures, "step", "final"], trace
    retry = server.requests[1 + failures]
    if failure.status == 429:
        assert retry.at - server.requests[1].at >= 0.95
    # A stream cut mid-body is retried without streaming (Claude Code's fallback).
    assert retry.stream == (failure.kind != "reset")


def test_claude_code_reports_a_refused_key(
    fake: Callable[..., AnthropicUpstream], claude: Path, tmp_path: Path
) -> None:
    server = fake(api_key="sk-ant-another-key")
    run = claude_run(claude, server.base_url, CLAUDE_TASK, tmp_path, max_retries=1)
    trace = _claude_trace(server, run)
    assert run.returncode == 1 and run.final.startswith("Invalid API key"), trace
    assert run.result and run.result["api_error_status"] == 401
    # It retried the 401 once (CLAUDE_CODE_MAX_RETRIES=1), as it retries everything.
    assert [s.kind for s in server.requests] == ["unauthorized", "unauthorized"], trace
