"""Claude Code (``claude -p`` from npm) with a model name it does not know (``glm-4.6``, as people
run it on GLM, Kimi, DeepSeek or a local model behind an Anthropic-compatible endpoint), on a long
scripted run against the fake Anthropic Messages API (``tests.anthropic_upstream``) at a small
window: direct it stops with "Prompt is too long"; through the proxy, with no window configured
for the model, it completes.

For a model it does not know Claude Code sends its environment block as ``messages[1]`` with role
``system`` (and 24 tools and its system prompt: about 21.5k tokens in the fake's count; each step
adds about 2.5k). The proxy reads that message (no ``x-compaction-skipped``) and keeps it in place.
Nothing tells it the window: the table has no ``glm-*``, the fake answers none of the metadata
questions, so the proxy starts from the default (128k) guess and learns the real one from the
fake's first refusal (Anthropic's words), sends that refused request again compacted to it, and
compacts every later request up front. ``CLAUDE_CODE_MAX_OUTPUT_TOKENS`` is 4096 (its default
32000 alone would not fit the window), and its own compaction is off (``DISABLE_COMPACT``) so that
direct it fails rather than summarizes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.anthropic_upstream import DONE_PREFIX, AnthropicUpstream
from tests.e2e.clients.anthropic_fake_helpers import CONTEXT_ERROR, started_fakes
from tests.e2e.clients.claude_code import ClaudeRun, claude_binary, claude_run
from tests.needs import agent_cli_unavailable

pytestmark = pytest.mark.e2e

CLAUDE_TASK = "Run the scripted checks one by one with Bash, then report."
MODEL = "glm-4.6"  # no built-in pattern covers it
WINDOW = 32_000
STEPS = 12
OPTIONS: dict[str, Any] = {"model": MODEL, "max_output_tokens": 4096, "own_compaction": False}


@pytest.fixture
def fake() -> Iterator[Callable[..., AnthropicUpstream]]:
    yield from started_fakes()


@pytest.fixture(scope="module")
def claude() -> Path:
    binary = claude_binary()
    if binary is None:
        agent_cli_unavailable("Claude Code", "@anthropic-ai/claude-code")
    return binary


def _trace(server: AnthropicUpstream, run: ClaudeRun) -> str:
    head = f"exit {run.returncode} in {run.seconds:.1f} s: {run.final[:300]}"
    return f"{head}\n{run.stderr[-1500:]}\n{server.summary()[-4000:]}"


def _system_messages(body: dict[str, Any]) -> list[tuple[int, list[str]]]:
    """(index, texts) of each system message in ``messages`` (a string content is one text)."""
    found = []
    for n, message in enumerate(body["messages"]):
        if isinstance(message, dict) and message.get("role") == "system":
            content = message.get("content")
            blocks = [{"text": content}] if isinstance(content, str) else content or []
            found.append((n, [str(b.get("text")) for b in blocks if isinstance(b, dict)]))
    return found


def _log(proxy: Any, event: str) -> list[dict[str, Any]]:
    lines = [orjson.loads(line) for line in proxy.log_lines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == event]


def test_claude_code_with_an_unknown_model_completes_through_the_proxy_where_direct_it_fails(
    fake: Callable[..., AnthropicUpstream], start_proxy: Any, claude: Path, tmp_path: Path
) -> None:
    direct = fake(window=WINDOW, steps=STEPS)
    failed = claude_run(claude, direct.base_url, CLAUDE_TASK, tmp_path / "direct", **OPTIONS)
    trace = _trace(direct, failed)
    assert failed.returncode == 1 and failed.final == "Prompt is too long", trace
    assert direct.rejected and all(CONTEXT_ERROR.fullmatch(s.error) for s in direct.rejected), trace
    assert all(s.body["model"] == MODEL for s in direct.requests)
    # The real shape of an unknown-model request: its environment block is messages[1], a system.
    assert all(_system_messages(s.body)[0][0] == 1 for s in direct.requests), trace
    direct_steps = max(s.step for s in direct.requests)
    assert direct_steps < STEPS // 2, trace

    server = fake(window=WINDOW, steps=STEPS)
    proxy = start_proxy({"anthropic": {"base_url": server.base_url}})  # no window for any model
    run = claude_run(claude, proxy.url, CLAUDE_TASK, tmp_path / "proxied", timeout=180, **OPTIONS)
    trace = _trace(server, run)
    assert run.returncode == 0, trace
    assert run.final == f"{DONE_PREFIX} completed {STEPS} steps", trace
    assert [s.step for s in server.requests if s.kind == "step"] == list(range(1, STEPS + 1)), trace
    assert server.requests[-1].kind == "final", trace
    assert server.problems == server.thinking_problems == server.leaks == [], trace
    assert server.merged == [], trace

    # Over the window only once: the request the proxy sent with the default guess, refused in
    # Anthropic's words; the proxy learned the window from it and sent that request again.
    refused = [s for s in server.requests if s.kind == "rejected"]
    assert len(refused) == 1 and CONTEXT_ERROR.fullmatch(refused[0].error), trace
    # Sent again compacted (it now offers the read tool, and the fake reads a saved output first).
    again = server.requests[refused[0].index + 1]
    assert again.kind in ("step", "read") and again.step == refused[0].step, trace
    assert again.tokens < refused[0].tokens and again.conversation == refused[0].conversation, trace
    assert all(s.budget <= WINDOW for s in server.requests if s.kind != "rejected"), trace
    learned = _log(proxy, "model_window_refused")
    assert [(e["model"], e["window"], e["retried"]) for e in learned] == [(MODEL, WINDOW, True)], learned

    # Its environment block stayed messages[1] of every view the upstream received, as sent; the
    # system messages it added later (its task-tools reminder, each time it came) stayed too, in
    # order (two a compaction brought together are joined: one message of both texts).
    environment = _system_messages(direct.requests[0].body)
    assert len(environment) == 1, environment
    before: list[str] = []
    for seen in server.requests:
        systems = _system_messages(seen.body)
        assert systems[0] == environment[0], (seen.index, trace)
        texts = [text for _, texts in systems for text in texts]
        assert texts[: len(before)] == before, (seen.index, texts, trace)
        before = texts
    assert len(before) > 1, before

    # Read, compacted, never skipped (what ``x-compaction-skipped`` would say is in the access log).
    asked = len([s for s in server.requests if not s.read_follow_up and s.kind != "rejected"])
    deadline = time.monotonic() + 10
    while len(requests := _log(proxy, "request")) < asked and time.monotonic() < deadline:
        time.sleep(0.1)  # its line is written once the answer has gone
    assert len(requests) == asked and {e["route"] for e in requests} == {"anthropic"}, requests
    assert all(e["skipped"] is None and e["status"] == 200 for e in requests), requests
    compacted = [e for e in requests if e.get("mechanisms")]
    assert compacted, requests
    largest = max(s.budget for s in server.requests if s.kind != "rejected")
    print(
        f"\nclient-run claude-code {MODEL}: {STEPS} steps, {len(server.requests)} requests, largest "
        f"{largest} of {WINDOW} tokens, {len(server.reads)} reads, {len(compacted)} compacted; direct: "
        f"{failed.final!r} after {direct_steps} steps"
    )
