"""Codex CLI through the real proxy (``POST /v1/responses``) on long tool runs.

Codex CLI (``codex_cli.CODEX_VERSION``, installed with npm into
``~/.cache/compaction-proxy/npm`` on first use, skipped without npm) runs ``codex exec`` with a
custom provider at ``compaction-proxy serve`` (policy ``improved``) and really runs its shell
commands; its own system prompt and tools are about 8k tokens, so its window is
``CODEX_WINDOW``. The model is ``tests.responses_upstream.ResponsesUpstream``, as in
``test_responses_clients.py``, and a run must pass the same checks. It also runs with its own
compaction on (its compaction requests go through the proxy like any other) and with its own
retries on (a failed read round is retried by Codex and the run completes); direct (no proxy),
the run fails with the context error, and a failed read round without retries ends the run
with an error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.e2e.clients.responses import leaks
from tests.e2e.clients.responses.codex_cli import (
    CodexRun,
    codex_binary,
    codex_errors,
    codex_run,
    codex_steps,
)
from tests.e2e.clients.responses.runs import (
    PROXY_CONFIG,
    UNLIMITED,
    assert_clean,
    failure_cases,
    quiet_clients,
    started_upstreams,
    task,
)
from tests.needs import agent_cli_unavailable
from tests.responses_upstream import DONE_PREFIX, STEP_MARK, Failure, ResponsesUpstream

pytestmark = [pytest.mark.e2e]

CODEX_WINDOW = 16_000
CODEX_STEPS = 12
# Codex compacts by itself above this many tokens in the test of its own compaction.
CODEX_AUTO_COMPACT = 15_500


@pytest.fixture(autouse=True)
def _quiet_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    quiet_clients(monkeypatch)


@pytest.fixture
def responses_upstream() -> Iterator[Callable[..., ResponsesUpstream]]:
    yield from started_upstreams()


@pytest.fixture(scope="session")
def codex() -> Path:
    binary = codex_binary()
    if binary is None:
        agent_cli_unavailable("Codex CLI", "@openai/codex")
    return binary


def _codex_trace(fake: ResponsesUpstream, run: CodexRun) -> str:
    quiet = "\n".join(line for line in run.stderr.splitlines() if STEP_MARK not in line)
    return (
        f"{fake.summary()}\nexit {run.returncode} in {run.seconds:.1f} s; last message {run.last_message!r}\n"
        f"stderr without the step outputs (tail): {quiet[-2500:]}"
    )


def test_codex_cli_long_run_through_the_proxy(
    codex: Path, responses_upstream: Callable[..., ResponsesUpstream], start_proxy: Any, tmp_path: Path
) -> None:
    fake = responses_upstream(window=CODEX_WINDOW, steps=CODEX_STEPS, read_every=1)
    proxy = start_proxy(
        {
            **PROXY_CONFIG,
            "context_windows": {"default": CODEX_WINDOW},
            "upstream": {"base_url": fake.base_url},
        }
    )
    run = codex_run(codex, proxy.base_url, task("codex", CODEX_STEPS), tmp_path)
    trace = _codex_trace(fake, run)
    print(trace)
    compactions = [s for s in fake.requests if s.request_kind == "compaction"]
    print(f"Codex's own compaction requests: {[s.index for s in compactions]}; other routes: {fake.others}")
    tools = [t.get("name", t.get("type")) for t in fake.requests[0].body.get("tools") or []]
    print(f"Codex's tools: {tools}")
    assert "exec_command" in tools, tools
    assert_clean(fake, CODEX_WINDOW, trace)
    assert run.returncode == 0, trace
    assert run.last_message.strip().startswith(DONE_PREFIX), trace
    assert DONE_PREFIX in run.stdout
    conversation = fake.conversation()
    assert conversation.finished and conversation.step == CODEX_STEPS, trace
    # Codex really ran every step's shell command, in order, and recorded its output.
    assert codex_steps(run.rollout) == list(range(1, CODEX_STEPS + 1)), trace
    assert fake.reads, f"the proxy never offered read_tool_output with a handle\n{trace}"
    assert len(fake.reads) == len(fake.follow_ups), trace
    # The proxy compacted: without it the run would have needed far more than the window.
    assert any("handle=out_" in orjson.dumps(s.body["input"]).decode() for s in fake.requests), trace
    assert fake.reasoning_echoed >= CODEX_STEPS // 2
    # Codex's own history never saw the read tool or a placeholder.
    assert run.rollout, "Codex wrote no session record"
    assert leaks(run.rollout) == [], trace
    print(
        f"\nclient-run codex-cli: {CODEX_STEPS} steps, {len(fake.requests)} requests, largest "
        f"{fake.max_tokens_seen} of {CODEX_WINDOW} tokens, {len(fake.reads)} reads"
    )


def test_codex_cli_direct_without_the_proxy_fails_with_the_context_error(
    codex: Path, responses_upstream: Callable[..., ResponsesUpstream], tmp_path: Path
) -> None:
    fake = responses_upstream(window=CODEX_WINDOW, steps=CODEX_STEPS, read_every=1)
    run = codex_run(codex, fake.base_url, task("codex", CODEX_STEPS), tmp_path)
    trace = _codex_trace(fake, run)
    print(trace)
    assert fake.rejected, trace
    assert not fake.conversation().finished, trace
    assert run.returncode != 0, trace
    assert any("context window" in line for line in codex_errors(run)), trace
    assert not run.last_message.strip().startswith(DONE_PREFIX), trace


CODEX_FAILURES = list(failure_cases([("codex-exec", True)]))


@pytest.mark.parametrize("name, failure, preamble", CODEX_FAILURES)
def test_codex_cli_sees_a_failed_read_round_as_an_error(
    name: str,
    failure: Failure,
    preamble: str | None,
    codex: Path,
    responses_upstream: Callable[..., ResponsesUpstream],
    start_proxy: Any,
    tmp_path: Path,
) -> None:
    fake = responses_upstream(
        window=UNLIMITED,
        steps=CODEX_STEPS,
        read_every=1,
        fail_read_follow_up=1,
        failure=failure,
        read_preamble=preamble,
    )
    proxy = start_proxy(
        {
            **PROXY_CONFIG,
            "context_windows": {"default": CODEX_WINDOW},
            "upstream": {"base_url": fake.base_url},
        }
    )
    run = codex_run(codex, proxy.base_url, task("codex", CODEX_STEPS), tmp_path)
    trace = _codex_trace(fake, run)
    print(trace)
    assert fake.failures_injected == 1, trace
    assert fake.problems == [], "\n".join(fake.problems)
    assert run.returncode != 0, f"Codex completed as if nothing failed\n{trace}"
    assert not run.last_message.strip().startswith(DONE_PREFIX), trace
    assert not fake.conversation().finished
    assert fake.requests[-1].kind == "failed", trace


def test_codex_cli_own_compaction_through_the_proxy(
    codex: Path, responses_upstream: Callable[..., ResponsesUpstream], start_proxy: Any, tmp_path: Path
) -> None:
    """Codex told its window is the proxy's, compacting by itself at ``CODEX_AUTO_COMPACT``
    tokens: its compaction requests (``tools: []``, a summary prompt, ``request_kind``
    ``compaction`` in ``x-codex-turn-metadata``) go through the proxy like any request, and the
    run goes on after them."""
    fake = responses_upstream(window=CODEX_WINDOW, steps=CODEX_STEPS, read_every=1)
    proxy = start_proxy(
        {
            **PROXY_CONFIG,
            "context_windows": {"default": CODEX_WINDOW},
            "upstream": {"base_url": fake.base_url},
        }
    )
    run = codex_run(
        codex,
        proxy.base_url,
        task("codex", CODEX_STEPS),
        tmp_path,
        context_window=CODEX_WINDOW,
        auto_compact=CODEX_AUTO_COMPACT,
    )
    trace = _codex_trace(fake, run)
    print(trace)
    compactions = [s for s in fake.requests if s.kind == "summary"]
    print(f"Codex's own compaction requests: {[(s.index, s.request_kind, s.tokens) for s in compactions]}")
    assert_clean(fake, CODEX_WINDOW, trace)
    assert run.returncode == 0, trace
    assert run.last_message.strip().startswith(DONE_PREFIX), trace
    assert compactions, f"Codex never compacted by itself\n{trace}"
    assert any(s.handles for s in fake.requests), f"the proxy never compacted\n{trace}"
    assert all(s.request_kind == "compaction" for s in compactions), trace
    assert fake.conversation().finished, trace
    assert leaks(run.rollout) == [], trace


def test_codex_cli_with_its_retries_recovers_from_a_failed_read_round(
    codex: Path, responses_upstream: Callable[..., ResponsesUpstream], start_proxy: Any, tmp_path: Path
) -> None:
    """The failure reaches Codex as the upstream's 500, so Codex's own retry (on by default)
    sends the request again, and the run completes."""
    fake = responses_upstream(
        window=CODEX_WINDOW,
        steps=CODEX_STEPS,
        read_every=1,
        fail_read_follow_up=1,
        failure=Failure("status", 500),
    )
    proxy = start_proxy(
        {
            **PROXY_CONFIG,
            "context_windows": {"default": CODEX_WINDOW},
            "upstream": {"base_url": fake.base_url},
        }
    )
    run = codex_run(codex, proxy.base_url, task("codex", CODEX_STEPS), tmp_path, retries=True)
    trace = _codex_trace(fake, run)
    print(trace)
    assert fake.failures_injected == 1, trace
    assert_clean(fake, CODEX_WINDOW, trace)
    assert run.returncode == 0, trace
    assert run.last_message.strip().startswith(DONE_PREFIX), trace
    assert fake.conversation().finished and fake.conversation().step == CODEX_STEPS, trace
