"""Real third-party agent clients through the real proxy, on long tool-using runs.

Each test drives one client library's own agent loop (the OpenAI Agents SDK on Chat
Completions, LiteLLM, langchain-openai, mini-swe-agent in text and tool-call mode) through
``compaction-proxy serve`` with policy ``improved`` and a 6000-token window. The model is
``tests.agent_upstream.AgentUpstream``: a scripted model that asks for ``STEPS`` large outputs
(about 2k tokens each), reads saved outputs back with ``read_tool_output`` whenever the proxy
offers it, enforces the same window like OpenAI (HTTP 400 ``context_length_exceeded``) and
checks the tool-call protocol of every request.

A run must: never send the model a request over its window (read rounds included); never
break the tool-call protocol; keep the task verbatim; finish with the final answer after
exactly ``STEPS`` steps run by the client; never show the client a ``read_tool_output`` call,
result or placeholder. When the model's answer after a read fails (HTTP 500 or 429, or the
connection reset mid-stream), the client must see an error, not a run that completes. When the
proxy summarizes a shell agent's history, the state ledger lists every command it summarized,
with its exit code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.agent_upstream import (
    DONE_PREFIX,
    RUN_HEADER,
    AgentUpstream,
    Failure,
    Seen,
    shell_command,
    step_output,
)
from tests.e2e.clients import ClientRun, langchain_loop, litellm_loop, mini_swe_agent, openai_agents

pytestmark = [
    pytest.mark.e2e,
    # Third-party noise from litellm's own pydantic models.
    pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince211"),
    pytest.mark.filterwarnings("ignore:Item .* is using the `ReadOnly` qualifier:UserWarning"),
]

WINDOW = 6000
STEPS = 30
# The proxy compacts at 0.8 x its window; the model's own window is the same 6000 tokens.
PROXY_CONFIG: dict[str, Any] = {"policy": "improved", "context_windows": {"default": WINDOW}}
# The model reads a saved output before every step once the proxy offers one, so read rounds
# happen at every size the view takes between two compactions, the largest included.
READ_EVERY = 1
# Failure tests look at error reporting alone: the model's window is not enforced there.
UNLIMITED = 10_000_000
CLIENT_TIMEOUT = 60.0
PREAMBLE = "Let me look at the saved output first. "
# Longer than the first words of a round the proxy holds back (proxy.dialects.chat.HELD_TEXT_CHARS).
LONG_PREAMBLE = PREAMBLE * 12
LEDGER_MARK = "## State ledger"
# The ledger test's window. At 6000 every command is still listed (steps the window has no room
# for are folded into the summary, not dropped), but the newest ones of mini-swe-agent's run can
# be listed without their exit code: tight-window state keeping is the state-contract issue's.
LEDGER_WINDOW = 12_000


@dataclass(frozen=True)
class Client:
    """One way to drive a client: ``name``, with ``stream`` on or off."""

    name: str
    stream: bool

    @property
    def final_command(self) -> str | None:
        return mini_swe_agent.SUBMIT if self.name.startswith("mini-swe-agent") else None

    def run(self, base_url: str, task: str, workdir: Path) -> ClientRun:
        turns = STEPS * 2 + 10
        # The scripted model keys its state by this header: the proxy may rewrite any message.
        headers = {RUN_HEADER: f"{self.name}-{'stream' if self.stream else 'plain'}"}
        if self.name == "openai-agents":
            return openai_agents.run(
                base_url, task, stream=self.stream, max_turns=turns, headers=headers, timeout=CLIENT_TIMEOUT
            )
        if self.name == "litellm":
            return litellm_loop.run(
                base_url, task, stream=self.stream, workdir=workdir, max_turns=turns, headers=headers
            )
        if self.name == "langchain-openai":
            return langchain_loop.run(base_url, task, stream=self.stream, max_turns=turns, headers=headers)
        if self.name == "mini-swe-agent-text":
            return mini_swe_agent.run(base_url, task, mode="text", workdir=workdir, headers=headers)
        if self.name == "mini-swe-agent-toolcall":
            return mini_swe_agent.run(base_url, task, mode="toolcall", workdir=workdir, headers=headers)
        raise AssertionError(self.name)


RUNS: list[tuple[str, Client]] = [
    ("openai-agents-run", Client("openai-agents", stream=False)),
    ("openai-agents-run_streamed", Client("openai-agents", stream=True)),
    ("litellm-completion", Client("litellm", stream=False)),
    ("litellm-completion-stream", Client("litellm", stream=True)),
    ("langchain-invoke", Client("langchain-openai", stream=False)),
    ("langchain-stream", Client("langchain-openai", stream=True)),
    ("mini-swe-agent-text", Client("mini-swe-agent-text", stream=False)),
    ("mini-swe-agent-toolcall", Client("mini-swe-agent-toolcall", stream=False)),
]
CLIENTS = [pytest.param(client, id=name) for name, client in RUNS]
SHELL_AGENTS = [pytest.param(client, id=name) for name, client in RUNS if name.startswith("mini-swe")]


def _failure_cases() -> Iterator[Any]:
    for name, client in RUNS:
        yield pytest.param(client, Failure("status", 500), None, id=f"{name}-http500")
        yield pytest.param(client, Failure("status", 429), None, id=f"{name}-http429")
        yield pytest.param(client, Failure("reset", after_chunks=2), None, id=f"{name}-reset")
        if client.stream:
            # The read call's answer already streamed text to the client when the next round fails
            # (a preamble longer than the proxy holds back, so the stream has started).
            yield pytest.param(client, Failure("status", 500), LONG_PREAMBLE, id=f"{name}-http500-after-text")


@pytest.fixture(autouse=True)
def _quiet_clients(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No client reads a developer's settings, phones home or retries on its own."""
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    monkeypatch.setenv("MSWEA_SILENT_STARTUP", "1")
    monkeypatch.setenv("MSWEA_GLOBAL_CONFIG_DIR", str(tmp_path / "mswea-config"))
    monkeypatch.setenv("MSWEA_COST_TRACKING", "ignore_errors")
    monkeypatch.setenv("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "1")
    monkeypatch.setenv("LANGSMITH_TRACING", "false")
    monkeypatch.setenv("LANGCHAIN_TRACING_V2", "false")
    for name in ("OPENAI_BASE_URL", "OPENAI_API_BASE", "OPENAI_API_KEY", "MSWEA_MODEL_NAME"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def agent_upstream() -> Iterator[Callable[..., AgentUpstream]]:
    started: list[AgentUpstream] = []

    def start(**options: Any) -> AgentUpstream:
        server = AgentUpstream(**options).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _task(client: Client) -> str:
    # Fixed per client: the same run sends the same requests every time.
    return f"Run the {STEPS} scripted checks one by one and report when all are done ({client.name} run)."


def _run(
    client: Client,
    agent: AgentUpstream,
    start_proxy: Any,
    tmp_path: Path,
    window: int = WINDOW,
    extra: dict[str, Any] | None = None,
) -> tuple[ClientRun | None, Exception | None]:
    config = {**PROXY_CONFIG, "context_windows": {"default": window}, **(extra or {})}
    proxy = start_proxy({**config, "upstream": {"base_url": agent.base_url}})
    workdir = tmp_path / "work"
    workdir.mkdir()
    try:
        return client.run(proxy.base_url, _task(client), workdir), None
    except Exception as exc:  # judged by the caller, after the model's own records
        return None, exc


def _leaks(text: str) -> list[str]:
    return [mark for mark in ("read_tool_output", "handle=out_") if mark in text]


def _content(message: Any) -> str:
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, str) else ""


def _ledger_gaps(request: Seen) -> list[tuple[int, str]]:
    """The steps gone from ``request``'s view whose command its state ledger does not list with
    its exit code (0: every scripted command succeeds): (step, ``missing`` or ``no exit code``)."""
    messages = request.body["messages"]
    ledger = next((_content(m) for m in messages if LEDGER_MARK in _content(m)), "")
    rest = orjson.dumps([m for m in messages if LEDGER_MARK not in _content(m)]).decode()
    issued = request.step - 1 if request.kind == "step" else request.step
    gaps = []
    for step in range(1, issued + 1):
        command = shell_command(step)
        if orjson.dumps(command).decode()[1:-1] in rest:
            continue  # still in the view
        if f"`{command}` -> 0" not in ledger:
            gaps.append((step, "no exit code" if f"`{command}`" in ledger else "missing"))
    return gaps


@pytest.mark.parametrize("client", CLIENTS)
def test_long_run_stays_in_the_window(
    client: Client, agent_upstream: Callable[..., AgentUpstream], start_proxy: Any, tmp_path: Path
) -> None:
    agent = agent_upstream(
        window=WINDOW,
        steps=STEPS,
        read_every=READ_EVERY,
        final_command=client.final_command,
        action_fence=mini_swe_agent.TEXT_FENCE,
    )
    run, error = _run(client, agent, start_proxy, tmp_path)
    trace = agent.summary()
    print(trace)
    # The model never got a request over its window, read rounds included.
    rejected = agent.rejected
    assert rejected == [], (
        f"{len(rejected)} request(s) over the {WINDOW}-token window, "
        f"{sum(s.read_follow_up for s in rejected)} of them read follow-up rounds "
        f"(largest {agent.max_tokens_seen} tokens); the client then failed with {error!r}\n{trace}"
    )
    assert agent.max_tokens_seen <= WINDOW
    assert agent.problems == [], "\n".join(agent.problems)
    assert agent.task_not_kept == [], f"the task was not kept verbatim\n{trace}"
    # The agent's own tools stay usable: a model asked with tool_choice none can only answer in
    # text, which an agent takes for its final answer.
    forbidden = [s.index for s in agent.requests if s.kind == "no_tools"]
    assert forbidden == [], (
        f"request(s) {forbidden} reached the model with tool_choice none although the agent has its "
        f"own tools: the model could only answer in text; the client then got {run.final if run else error!r}"
        f"\n{trace}"
    )
    assert error is None, f"the client failed: {error!r}\n{trace}"
    assert run is not None
    # The run completed: the final answer after every step, each run once, in order, by the client.
    assert run.final.startswith(DONE_PREFIX), f"final answer {run.final!r}\n{trace}"
    assert run.tool_steps == list(range(1, STEPS + 1))
    conversation = agent.conversation()
    assert conversation.finished and conversation.step == STEPS
    # Saved outputs were read back, and the proxy answered every read (with content or a reason).
    assert agent.reads, f"the proxy never offered read_tool_output with a handle\n{trace}"
    unanswered = len(agent.reads) - len(agent.follow_ups)
    assert unanswered == 0, (
        f"{unanswered} of {len(agent.reads)} read calls got no result: the proxy asked the model again "
        f"without them\n{trace}"
    )
    # The client never saw the proxy's tool, its calls, its results or a placeholder.
    assert _leaks(run.history_text()) == []
    print(
        f"\nclient-run {client.name}: {STEPS} steps, {len(agent.requests)} requests, largest "
        f"{agent.max_tokens_seen} of {WINDOW} tokens, {len(agent.reads)} reads"
    )


@pytest.mark.parametrize("client, failure, preamble", list(_failure_cases()))
def test_a_failed_read_round_reaches_the_client_as_an_error(
    client: Client,
    failure: Failure,
    preamble: str | None,
    agent_upstream: Callable[..., AgentUpstream],
    start_proxy: Any,
    tmp_path: Path,
) -> None:
    agent = agent_upstream(
        window=UNLIMITED,
        steps=STEPS,
        read_every=READ_EVERY,
        final_command=client.final_command,
        action_fence=mini_swe_agent.TEXT_FENCE,
        fail_read_follow_up=1,
        failure=failure,
        read_preamble=preamble,
    )
    run, error = _run(client, agent, start_proxy, tmp_path)
    trace = agent.summary()
    print(f"client error: {error!r}\n{trace}")
    assert agent.failures_injected == 1, f"no read follow-up round was failed\n{trace}"
    assert agent.problems == [], "\n".join(agent.problems)
    assert error is not None, (
        f"the client completed as if nothing failed: final answer {run.final if run else None!r} "
        f"after {len(run.tool_steps) if run else 0} steps\n{trace}"
    )
    assert "timeout" not in type(error).__name__.lower(), f"the client hung instead: {error!r}"
    # The run stopped there: nothing was asked after the failed round.
    assert not agent.conversation().finished
    assert agent.requests[-1].kind == "failed", trace


@pytest.mark.parametrize("client", SHELL_AGENTS)
def test_the_ledger_lists_every_summarized_command(
    client: Client, agent_upstream: Callable[..., AgentUpstream], start_proxy: Any, tmp_path: Path
) -> None:
    """mini-swe-agent's commands (text actions or ``bash`` calls) and their exit codes survive
    summaries in the state ledger. No reads here: only the summaries are looked at."""
    agent = agent_upstream(
        window=LEDGER_WINDOW,
        steps=STEPS,
        read_every=0,
        final_command=client.final_command,
        action_fence=mini_swe_agent.TEXT_FENCE,
    )
    # The shown ledger is held to ledger_share x window (0.1 by default: older commands are then
    # in the complete ledger under the handle it names, tests/policies/test_room_to_read.py);
    # here it is given room for all of them, so the shown one can be checked.
    roomy = {
        "policy": "improved_ledger",
        "policies": {
            "improved_ledger": {"extends": "improved", "overrides": {"summarize": {"ledger_share": 0.3}}}
        },
    }
    run, error = _run(client, agent, start_proxy, tmp_path, window=LEDGER_WINDOW, extra=roomy)
    trace = agent.summary()
    assert error is None and run is not None, f"the client failed: {error!r}\n{trace}"
    assert run.final.startswith(DONE_PREFIX)
    with_ledger = [s for s in agent.requests if any(LEDGER_MARK in _content(m) for m in s.body["messages"])]
    assert with_ledger, f"the proxy never summarized\n{trace}"
    gaps = {s.index: gaps for s in with_ledger if (gaps := _ledger_gaps(s))}
    missing = sorted({step for found in gaps.values() for step, kind in found if kind == "missing"})
    no_exit = sorted({step for found in gaps.values() for step, kind in found if kind == "no exit code"})
    assert gaps == {}, (
        f"{len(gaps)} of {len(with_ledger)} summarized views lost commands. Steps gone from the view "
        f"and absent from the ledger: {missing}; listed without their exit code: {no_exit}.\n"
        f"Per request: {gaps}\n{trace}"
    )


def test_the_scripted_command_prints_what_the_function_tools_return() -> None:
    import subprocess

    printed = subprocess.run(shell_command(7), shell=True, capture_output=True, text=True, check=True)
    assert printed.stdout.rstrip("\n") == step_output(7)
