"""What the Responses client tests share: the scripted runs, the ways a read round is made to
fail, the fake model's start and stop, and the checks every clean run must pass."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.e2e.clients.responses import ClientRun, openai_agents, openai_sdk
from tests.responses_upstream import RUN_HEADER, Failure, ResponsesUpstream

WINDOW = 6000
STEPS = 30
PROXY_CONFIG: dict[str, Any] = {"policy": "improved", "context_windows": {"default": WINDOW}}
# Failure tests look at error reporting alone: the model's window is not enforced there.
UNLIMITED = 10_000_000
PREAMBLE = "Let me look at the saved output first. "
# Longer than the first characters of a round the proxy holds (HELD_TEXT_CHARS): it streams.
LONG_PREAMBLE = PREAMBLE * 12


def quiet_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    """No client reads a developer's settings or sends traces (each test module's autouse
    fixture calls this)."""
    for name in ("OPENAI_BASE_URL", "OPENAI_API_BASE", "OPENAI_API_KEY", "OPENAI_AGENTS_DISABLE_TRACING"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")


def started_upstreams() -> Iterator[Callable[..., ResponsesUpstream]]:
    """The body of each test module's ``responses_upstream`` fixture: start fake models with
    the options given, stop them all after the test."""
    started: list[ResponsesUpstream] = []

    def start(**options: Any) -> ResponsesUpstream:
        server = ResponsesUpstream(**options).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@dataclass(frozen=True)
class Client:
    name: str  # sdk, sdk-helper, agents
    stream: bool

    def run(self, base_url: str, task: str) -> ClientRun:
        # The scripted model keys its state by this header: the proxy may rewrite any item.
        headers = {RUN_HEADER: f"{self.name}-{'stream' if self.stream else 'plain'}"}
        turns = STEPS * 2 + 10
        if self.name.startswith("sdk"):
            helper = self.name == "sdk-helper"
            return openai_sdk.run(
                base_url, task, stream=self.stream, headers=headers, max_turns=turns, helper=helper
            )
        return openai_agents.run(base_url, task, stream=self.stream, headers=headers, max_turns=turns)


RUNS = [
    ("openai-sdk-responses.create", Client("sdk", stream=False)),
    ("openai-sdk-responses.create-stream", Client("sdk", stream=True)),
    ("openai-sdk-responses.stream", Client("sdk-helper", stream=True)),
    ("openai-agents-Runner.run", Client("agents", stream=False)),
    ("openai-agents-Runner.run_streamed", Client("agents", stream=True)),
]
CLIENTS = [pytest.param(client, id=name) for name, client in RUNS]


def failure_cases(runs: list[tuple[str, bool]]) -> Iterator[Any]:
    """``(name, failure, preamble)`` parameters: each run (``name``, streamed or not) with its
    first read follow-up round failed each way."""
    for name, stream in runs:
        yield pytest.param(name, Failure("status", 500), None, id=f"{name}-http500")
        yield pytest.param(name, Failure("status", 429), None, id=f"{name}-http429")
        yield pytest.param(name, Failure("reset", after_events=6), None, id=f"{name}-reset")
        if stream:
            # The read answer already streamed text to the client when the next round fails.
            yield pytest.param(name, Failure("status", 500), LONG_PREAMBLE, id=f"{name}-http500-after-text")


def task(name: str, steps: int = STEPS) -> str:
    # Fixed per run: the same run sends the same requests every time.
    return f"Run the {steps} scripted checks one by one and report when all are done ({name} run)."


def assert_clean(fake: ResponsesUpstream, window: int, trace: str) -> None:
    """Nothing over the window, no protocol problem, reasoning back byte for byte, no read item
    in the client's own history."""
    rejected = fake.rejected
    assert rejected == [], (
        f"{len(rejected)} request(s) over the {window}-token window, "
        f"{sum(s.read_follow_up for s in rejected)} of them read follow-up rounds "
        f"(largest {fake.max_tokens_seen} tokens)\n{trace}"
    )
    assert fake.max_tokens_seen <= window
    assert fake.problems == [], "protocol problems:\n" + "\n".join(fake.problems) + f"\n{trace}"
    assert fake.reasoning_problems == [], "reasoning altered:\n" + "\n".join(fake.reasoning_problems)
    assert fake.leaks == [], "read_tool_output in the client's history:\n" + "\n".join(fake.leaks)
    if fake.follower_changes:  # informational (see tests.responses_upstream.checks.follower_changes)
        print(f"{len(fake.follower_changes)} reasoning item(s) came back with another following item:")
        print("\n".join(fake.follower_changes[:10]))
