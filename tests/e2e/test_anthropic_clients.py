"""Real Anthropic clients through the proxy, against a fake Messages API that behaves like the real
one (``tests.anthropic_upstream``: its own tokenizer, the real context errors, the protocol and
thinking-signature checks, Anthropic's streams and failures).

- The official ``anthropic`` SDK, every way it is called (create, async, raw stream, the
  ``messages.stream`` helper, async helper): a 30-step tool-using session at a small window
  completes through the proxy, every request within the window, no protocol problem, no altered
  thinking, no ``read_tool_output`` leak; the same run direct fails with the context error.
- Failed read rounds reach the SDK as its own exception classes; mixed answers never run a call
  planned before the read.
- Claude Code (``claude -p`` from npm) on a multi-step task at a small window: direct it stops
  with "Prompt is too long", through the proxy it completes.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tests.anthropic_upstream import DONE_PREFIX, AnthropicUpstream, Failure
from tests.e2e.clients import anthropic_sdk_loop as sdk
from tests.e2e.clients.claude_code import API_KEY as CLAUDE_KEY
from tests.e2e.clients.claude_code import claude_binary, claude_run
from tests.needs import agent_cli_unavailable

pytestmark = pytest.mark.e2e

TASK = "Run the scripted checks one by one with run_check, then report."
CLAUDE_TASK = "Run the scripted checks one by one with Bash, then report."
WINDOW = 16_000  # tight: the proxy compacts at nearly every step
ROOMY = 40_000  # a window where offloaded outputs are read back between compaction points
STEPS = 30


@pytest.fixture
def fake() -> Iterator[Callable[..., AnthropicUpstream]]:
    started: list[AnthropicUpstream] = []

    def start(**options: Any) -> AnthropicUpstream:
        server = AnthropicUpstream(**options).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def proxy_for(start_proxy: Any, server: AnthropicUpstream, window: int, **extra: Any) -> Any:
    return start_proxy(
        {
            "policy": "improved",
            "anthropic": {"base_url": server.base_url},
            "context_windows": {"claude-*": window, "default": window},
            **extra,
        }
    )


def trace(server: AnthropicUpstream) -> str:
    return server.summary()[-4000:]


def assert_clean(server: AnthropicUpstream, window: int) -> None:
    assert server.problems == [] and server.thinking_problems == [] and server.leaks == [], trace(server)
    assert server.merged == [], trace(server)  # the proxy's views alternate roles themselves
    assert server.rejected == [] and server.max_tokens_seen <= window, trace(server)


@pytest.mark.parametrize("variant", sdk.VARIANTS)
def test_a_long_sdk_session_at_a_small_window_completes_through_the_proxy(
    variant: sdk.Variant, fake: Callable[..., AnthropicUpstream], start_proxy: Any
) -> None:
    server = fake(window=WINDOW, steps=STEPS)
    proxy = proxy_for(start_proxy, server, WINDOW)
    run = sdk.run(proxy.url, TASK, variant=variant)
    assert run.final == f"{DONE_PREFIX} completed {STEPS} steps", trace(server)
    assert run.tool_steps == list(range(1, STEPS + 1))  # each step once, in order
    assert run.stream_problems == []
    assert_clean(server, WINDOW)
    assert server.read_follow_ups, "the model never read a saved output back"
    assert "read_tool_output" not in run.history_text()
    # The window was used, not wasted: late requests come close to it.
    assert server.max_tokens_seen > WINDOW * 0.6
    print(
        f"\nclient-run anthropic-sdk {variant}: {STEPS} steps, {len(server.requests)} requests, largest "
        f"{server.max_tokens_seen} of {WINDOW} tokens, {server.read_follow_ups} reads"
    )


def test_between_compaction_points_the_prompt_cache_keeps_hitting(
    fake: Callable[..., AnthropicUpstream], start_proxy: Any
) -> None:
    """With the client's moving breakpoint and the proxy's on the compacted prefix, most prompt
    tokens of a long session are cache reads (by the fake's implementation of the real rule)."""
    server = fake(window=ROOMY, steps=40)
    proxy = proxy_for(start_proxy, server, ROOMY)
    run = sdk.run(proxy.url, TASK, variant="stream")
    assert run.final == f"{DONE_PREFIX} completed 40 steps"
    assert_clean(server, ROOMY)
    read = sum(s.cache_read for s in server.requests)
    # 0.79 measured with the improved arms' 0.75 trigger (each compaction point re-sends its
    # prefix once; the replay through this door measures the lower trigger as cheaper overall).
    assert read / sum(s.tokens for s in server.requests) > 0.75


@pytest.mark.parametrize("variant", ["create", "helper"])
def test_the_same_session_direct_fails_with_the_context_error(
    variant: sdk.Variant, fake: Callable[..., AnthropicUpstream]
) -> None:
    server = fake(window=WINDOW, steps=STEPS)
    run = sdk.run(server.base_url, TASK, variant=variant, raise_errors=False)
    assert isinstance(run.error, anthropic.BadRequestError), run.error
    assert "exceed context limit" in str(run.error) or "prompt is too long" in str(run.error)
    assert len(run.tool_steps) < STEPS


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        pytest.param(Failure(status=529), anthropic.InternalServerError, id="529"),
        pytest.param(Failure(status=429, retry_after="0"), anthropic.RateLimitError, id="429"),
        pytest.param(Failure(status=500), anthropic.InternalServerError, id="500"),
        pytest.param(Failure("stream_error", after_events=4), anthropic.APIStatusError, id="error-event"),
        pytest.param(Failure("reset", after_events=4), Exception, id="reset"),
    ],
)
@pytest.mark.parametrize("variant", ["create", "stream", "helper"])
def test_a_failed_read_round_reaches_the_sdk_as_an_error(
    variant: sdk.Variant,
    failure: Failure,
    expected: type[Exception],
    fake: Callable[..., AnthropicUpstream],
    start_proxy: Any,
) -> None:
    server = fake(window=WINDOW, steps=STEPS, fail_read_follow_up=1, failure=failure)
    proxy = proxy_for(start_proxy, server, WINDOW)
    run = sdk.run(proxy.url, TASK, variant=variant, raise_errors=False)
    assert isinstance(run.error, expected), (run.error, trace(server))
    assert not run.final.startswith(DONE_PREFIX)
    if isinstance(run.error, anthropic.APIStatusError) and failure.kind == "status":
        assert run.error.status_code == failure.status
    assert server.problems == [] and server.thinking_problems == [] and server.leaks == []


def test_with_its_retries_the_sdk_recovers_from_a_failed_read_round(
    fake: Callable[..., AnthropicUpstream], start_proxy: Any
) -> None:
    server = fake(window=WINDOW, steps=12, fail_read_follow_up=1, failure=Failure(status=529))
    proxy = proxy_for(start_proxy, server, WINDOW)
    run = sdk.run(proxy.url, TASK, variant="helper", max_retries=2)
    assert run.final == f"{DONE_PREFIX} completed 12 steps" and run.tool_steps == list(range(1, 13))
    assert_clean(server, WINDOW)


@pytest.mark.parametrize("mixed", ["before", "after"])
@pytest.mark.parametrize("variant", ["create", "stream"])
def test_a_mixed_answer_never_runs_the_call_planned_before_the_read(
    variant: sdk.Variant, mixed: str, fake: Callable[..., AnthropicUpstream], start_proxy: Any
) -> None:
    """The answer goes back whole (its thinking is only valid in the message it came in), the
    planned call answered "not run"; the model calls it again with what it read."""
    server = fake(window=ROOMY, steps=STEPS, mixed=mixed)
    proxy = proxy_for(start_proxy, server, ROOMY)
    run = sdk.run(proxy.url, TASK, variant=variant)
    assert run.final == f"{DONE_PREFIX} completed {STEPS} steps", trace(server)
    assert len(server.mixed_calls) > 5, "no mixed answer was made"
    assert run.tool_steps == list(range(1, STEPS + 1))  # no step ran twice, none was skipped
    assert_clean(server, ROOMY)


# ----- Claude Code ------------------------------------------------------------------------------

CLAUDE_WINDOW = 50_000
CLAUDE_STEPS = 12


@pytest.fixture(scope="module")
def claude() -> Path:
    binary = claude_binary()
    if binary is None:
        agent_cli_unavailable("Claude Code", "@anthropic-ai/claude-code")
    return binary


def test_claude_code_completes_a_long_task_through_the_proxy_where_direct_it_fails(
    fake: Callable[..., AnthropicUpstream], start_proxy: Any, claude: Path, tmp_path: Path
) -> None:
    """Its system prompt and 24 tools are about 31k tokens; each step adds about 2.5k. At a 50k
    window (answers of at most 4,096 tokens), 12 steps do not fit: without its own compaction
    Claude Code stops with "Prompt is too long"; through the proxy it completes."""
    options = {"max_output_tokens": 4096, "own_compaction": False}
    direct = fake(window=CLAUDE_WINDOW, steps=CLAUDE_STEPS)
    failed = claude_run(claude, direct.base_url, CLAUDE_TASK, tmp_path / "direct", **options)
    assert failed.returncode == 1 and failed.final == "Prompt is too long", failed.stdout[-1500:]

    server = fake(window=CLAUDE_WINDOW, steps=CLAUDE_STEPS)
    proxy = proxy_for(start_proxy, server, CLAUDE_WINDOW)
    run = claude_run(claude, proxy.url, CLAUDE_TASK, tmp_path / "proxied", timeout=180, **options)
    assert run.returncode == 0, (run.stdout[-1500:], run.stderr[-1500:], trace(server))
    assert run.final == f"{DONE_PREFIX} completed {CLAUDE_STEPS} steps", trace(server)
    assert_clean(server, CLAUDE_WINDOW)
    assert [s.path for s in server.requests] == ["/v1/messages?beta=true"] * len(server.requests)
    assert server.others == []  # its HEAD / probe is answered by the proxy
    # Its cache breakpoints stay valid, and the compacted prefix gets one of the proxy's.
    assert all(len(s.cache_breakpoints) <= 4 for s in server.requests)
    print(
        f"\nclient-run claude-code: {CLAUDE_STEPS} steps, {len(server.requests)} requests, largest "
        f"{server.max_tokens_seen} of {CLAUDE_WINDOW} tokens, {server.read_follow_ups} reads; direct: "
        f"{failed.final!r} after {max(s.step for s in direct.requests)} steps"
    )


def test_the_token_factor_converges_to_the_upstreams_count(
    fake: Callable[..., AnthropicUpstream], start_proxy: Any
) -> None:
    """The fake counts like no OpenAI encoding does (its own tokenizer: o200k times 1.2 plus its
    overheads). The proxy starts from the configured 1.3 and learns the ratio from the usage each
    answer reports: its estimate of every later request is within a few percent, never below
    the real count by more than that (the 90th percentile plus 2% errs on the safe side)."""
    server = fake(window=ROOMY, steps=STEPS)
    proxy = proxy_for(start_proxy, server, ROOMY, events={"record_skipped": True})
    run = sdk.run(proxy.url, TASK, variant="create")
    assert run.final == f"{DONE_PREFIX} completed {STEPS} steps"
    deadline = time.monotonic() + 10
    while True:
        events = httpx.get(
            proxy.url + "/v1/compaction/events", params={"limit": 500}, headers={"x-api-key": sdk.API_KEY}
        ).json()["data"]
        if len(events) >= run.turns - server.read_follow_ups or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    counts = [e["token_count"] for e in sorted(events, key=lambda e: e["time"]) if e.get("token_count")]
    errors = [(c["estimated"] - c["reported"]) / c["reported"] for c in counts if c["reported"]]
    assert len(errors) >= 20
    first, calibrated = errors[:3], errors[5:]
    assert all(e > 0.05 for e in first), errors  # the default factor overestimates this tokenizer
    assert max(abs(e) for e in calibrated) < 0.05, calibrated
    assert min(calibrated) > -0.02, calibrated
    print(
        f"\ntoken estimate vs the upstream's count: default factor {statistics.mean(first):+.1%} mean, "
        f"calibrated {statistics.mean(calibrated):+.1%} mean, {min(calibrated):+.1%}..{max(calibrated):+.1%}"
    )


def test_claude_codes_own_compact_goes_as_sent_and_is_recorded(
    fake: Callable[..., AnthropicUpstream], start_proxy: Any, claude: Path, tmp_path: Path
) -> None:
    """``claude -p --continue /compact`` after a run: its summarization request is recognized,
    sent upstream as Claude Code wrote it (it fits), and recorded in the compaction event."""
    server = fake(steps=2)
    proxy = proxy_for(start_proxy, server, 200_000)
    first = claude_run(claude, proxy.url, CLAUDE_TASK, tmp_path)
    assert first.returncode == 0 and first.final == f"{DONE_PREFIX} completed 2 steps"
    compact = claude_run(claude, proxy.url, "/compact", tmp_path, extra_args=["--continue"])
    assert compact.returncode == 0, compact.stdout[-1000:]
    assert server.requests[-1].kind == "summary"
    deadline = time.monotonic() + 10
    while True:
        events = httpx.get(proxy.url + "/v1/compaction/events", headers={"x-api-key": CLAUDE_KEY}).json()[
            "data"
        ]
        recorded = [e for e in events if (e.get("dialect_notes") or {}).get("agent_compaction")]
        if recorded or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert recorded and recorded[0]["dialect"] == "anthropic"
    assert recorded[0]["dialect_notes"]["agent_compaction"] == {
        "agent": "claude-code",
        "action": "forwarded as sent",
    }
