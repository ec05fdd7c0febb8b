"""The real Gemini CLI (``gemini -p ... --yolo``, ``@google/gemini-cli`` 0.61.0 from npm) against
the fake Gemini API at a tight window: direct, the run fails with the API's own context error;
through the proxy (``GOOGLE_GEMINI_BASE_URL`` at it), the same run completes, every request
within the window, every ``functionCall`` answered and every thought signature where the model
gave it, outputs offloaded and read back inside the proxy. Skipped without npm, unless
``CPX_REQUIRE_CLIENTS=1`` makes that a failure."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.clients.gemini_cli import API_KEY, gemini_binary, gemini_run
from tests.gemini_upstream import DONE_PREFIX, GeminiUpstream
from tests.needs import agent_cli_unavailable

pytestmark = pytest.mark.e2e

# Gemini CLI's own system prompt and tools are about 10k tokens: room for a few steps' outputs.
WINDOW = 16_384
STEPS = 10
TASK = "Run the ten checks one by one, then report which failed."


@pytest.fixture(scope="module")
def gemini() -> Path:
    binary = gemini_binary()
    if binary is None:
        agent_cli_unavailable("Gemini CLI", "@google/gemini-cli")
    return binary


@pytest.fixture
def fake() -> Iterator[Callable[..., GeminiUpstream]]:
    started: list[GeminiUpstream] = []

    def start(**options: Any) -> GeminiUpstream:
        server = GeminiUpstream(window=WINDOW, steps=STEPS, read_every=3, api_key=API_KEY, **options).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def test_gemini_cli_fails_direct_at_the_window(
    fake: Callable[..., GeminiUpstream], gemini: Path, tmp_path: Path
) -> None:
    server = fake()
    run = gemini_run(gemini, server.base_url, TASK, tmp_path)
    assert run.returncode != 0, run.stdout[-2000:]
    assert DONE_PREFIX not in run.stdout
    refused = [s for s in server.requests if s.kind == "refused"]
    assert refused and refused[0].tokens > WINDOW
    assert "exceeds the maximum number of tokens allowed" in run.stdout + run.stderr


def test_gemini_cli_completes_through_the_proxy_within_the_window(
    fake: Callable[..., GeminiUpstream], gemini: Path, tmp_path: Path, start_proxy: Any
) -> None:
    server = fake()
    proxy = start_proxy(
        {
            "policy": "improved",
            "gemini": {"base_url": server.base_url},
            "models": {"gemini-*": {"window": WINDOW, "token_factor": 1.2}},
        }
    )
    run = gemini_run(gemini, proxy.url, TASK, tmp_path)
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-3000:])
    assert f"{DONE_PREFIX} finished all {STEPS} steps." in run.stdout
    requests = server.requests
    main = [s for s in requests if s.kind in ("step", "read", "final")]
    assert [s.kind for s in requests if s.kind in ("refused", "invalid", "unauthorized")] == []
    assert max(s.tokens for s in requests) <= WINDOW
    assert all(s.problems == [] and s.signature_problems == [] and s.leaks == [] for s in requests), [
        (s.index, s.problems, s.signature_problems, s.leaks) for s in requests
    ]
    assert sum(1 for s in main if s.kind == "step") == STEPS and main[-1].kind == "final"
    assert any(s.handles for s in main) and any(s.read_follow_up for s in main)
    assert all(s.headers.get("x-goog-api-key") == API_KEY for s in requests)
    assert not any(API_KEY in line for line in proxy.log_lines())
    # The figures of the run (the closing note asks for them).
    largest = max(s.tokens for s in main)
    print(
        f"\nGemini CLI through the proxy: {len(requests)} requests, largest {largest} of {WINDOW}, "
        f"{sum(1 for s in main if s.kind == 'read')} reads"
    )
