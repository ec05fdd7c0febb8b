"""Real Responses API clients through the real proxy (``POST /v1/responses``) on long tool runs.

Three clients drive their own agent loop through ``compaction-proxy serve`` with policy
``improved``: the ``openai`` SDK (``client.responses.create``, a loop driven here the way Codex
drives it with ``store: false``), the OpenAI Agents SDK's default model (``OpenAIResponsesModel``),
and Codex CLI itself (``codex exec``, from npm). The model is
``tests.responses_upstream.ResponsesUpstream``: a scripted reasoning model that asks for large
tool outputs (about 2k tokens each), reads saved outputs back with ``read_tool_output`` whenever
the proxy offers it, enforces the window like OpenAI (HTTP 400 ``context_length_exceeded``),
checks the protocol of every input (call/output pairs, reasoning items followed by their turn)
and that every reasoning item comes back with its ``encrypted_content`` byte for byte.

A run must: never send the model a request over its window (read rounds included); never break
the protocol; never alter ``encrypted_content``; complete with the final answer after every step;
never show the client a ``read_tool_output`` call or result. When the model's answer after a read
fails (HTTP 500 or 429, a connection reset, or a failure after text already streamed), the client
must get an error, not a completed response. Direct (no proxy), the same runs fail with the
context error: that is what the proxy is for.

The ``openai`` SDK runs three ways: ``responses.create`` (JSON), ``responses.create(stream=True)``
(its raw events checked here for a well-formed stream: one response id, sequence numbers,
output indexes, the completed output equal to the items streamed) and the SDK's own
``responses.stream()`` helper (which refuses an inconsistent stream). Read answers may also
stream text first, or call the client's tool beside the read (a mixed answer). Codex CLI
(``CODEX_VERSION``, installed with npm into ``~/.cache/compaction-proxy/npm`` on first use,
skipped without npm) runs ``codex exec`` with a custom provider at the proxy and really runs its
shell commands; its own system prompt and tools are about 8k tokens, so its window is
``CODEX_WINDOW``. It also runs with its own compaction on (its compaction requests go through
the proxy like any other) and with its own retries on (a failed read round is retried by Codex
and the run completes).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.agent_upstream import STEP_MARK
from tests.responses_upstream import (
    DONE_PREFIX,
    READ_TOOL,
    RUN_HEADER,
    Failure,
    ResponsesUpstream,
    step_output,
)

pytestmark = [pytest.mark.e2e]

WINDOW = 6000
STEPS = 30
MODEL = "agent-model"
# Codex runs as the model of the captured bodies (tests/fixtures/clients): its own tool set for it
# (exec_command, apply_patch as a custom tool, tool_search, web_search...).
CODEX_MODEL = "gpt-5.5"
API_KEY = "sk-responses-clients-000000000000"
PROXY_CONFIG: dict[str, Any] = {"policy": "improved", "context_windows": {"default": WINDOW}}
# Failure tests look at error reporting alone: the model's window is not enforced there.
UNLIMITED = 10_000_000
CLIENT_TIMEOUT = 60.0
PREAMBLE = "Let me look at the saved output first. "
TOOL_NAME = "run_check"
TOOL_DESCRIPTION = "Run the scripted check number `step` and return its full log."
INSTRUCTIONS = "You run checks with run_check, one per turn, then report."

# Codex CLI: its steps run real shell commands (GNU seq and sed) printing about 2k tokens each.
CODEX_VERSION = "0.171.0"
CODEX_WINDOW = 16_000
CODEX_STEPS = 12
CODEX_TIMEOUT = 90.0
# Codex compacts by itself above this many tokens in the test of its own compaction.
CODEX_AUTO_COMPACT = 15_500
STEP_LINE = re.compile(rf"{STEP_MARK}-(\d+) line 1:")
NPM_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "compaction-proxy" / "npm"


class StreamFailed(Exception):
    """A Responses stream that ended with an ``error`` or ``response.failed`` event, or without
    ``response.completed``."""

    def __init__(self, message: str, event: Any = None) -> None:
        super().__init__(message)
        self.event = event


@dataclass
class ClientRun:
    final: str
    tool_steps: list[int] = field(default_factory=list)  # steps the client's own tool ran, in order
    history: Any = None  # the client's own record of the run, JSON-able
    stream_problems: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)

    def history_text(self) -> str:
        return orjson.dumps(self.history, default=str).decode()


def _leaks(text: str) -> list[str]:
    return [mark for mark in (READ_TOOL, "handle=out_") if mark in text]


def _tool_schema() -> dict[str, Any]:
    return {
        "type": "function",
        "name": TOOL_NAME,
        "description": TOOL_DESCRIPTION,
        "parameters": {
            "type": "object",
            "properties": {"step": {"type": "integer", "description": "The check's number."}},
            "required": ["step"],
            "additionalProperties": False,
        },
        "strict": True,
    }


def stream_problems(events: list[dict[str, Any]]) -> list[str]:
    """What makes a Responses event stream ill-formed for a client: sequence numbers not counting
    up from 0, not exactly one ``response.created`` first and one ``response.completed`` last, an
    item event before its ``output_item.added`` or after its ``output_item.done``, output indexes
    not assigned in order, or a completed ``output`` that differs from the items streamed."""
    problems: list[str] = []
    numbers = [e.get("sequence_number") for e in events]
    if numbers != list(range(len(events))):
        problems.append(f"sequence_number is not 0..{len(events) - 1}: {numbers}")
    kinds = [e.get("type") for e in events]
    ids = {
        str(e.get("type")): (e.get("response") or {}).get("id")
        for e in events
        if e.get("type") in ("response.created", "response.in_progress", "response.completed")
    }
    if len(set(ids.values())) > 1:
        problems.append(f"the response changed its id during the stream: {ids}")
    if kinds[:1] != ["response.created"] or kinds.count("response.created") != 1:
        problems.append(f"response.created is not first and alone: {kinds[:3]}")
    if kinds.count("response.completed") != 1 or kinds[-1] != "response.completed":
        problems.append(f"response.completed is not last and alone (last: {kinds[-1:]})")
    open_items: dict[int, str] = {}
    done: dict[int, Any] = {}
    for position, event in enumerate(events):
        index = event.get("output_index")
        kind = str(event.get("type"))
        if not isinstance(index, int):
            continue
        if kind == "response.output_item.added":
            expected = len(done) + len(open_items)
            if index != expected or index in done:
                problems.append(f"event {position}: item added at output_index {index}, expected {expected}")
            open_items[index] = str((event.get("item") or {}).get("id"))
        elif index not in open_items:
            problems.append(f"event {position}: {kind} for output_index {index}, which is not open")
        elif kind == "response.output_item.done":
            done[index] = event.get("item")
            del open_items[index]
        elif event.get("item_id") not in (None, open_items[index]):
            problems.append(f"event {position}: {kind} names item {event.get('item_id')!r}")
    if open_items:
        problems.append(f"items never done: {sorted(open_items)}")
    completed = next((e for e in reversed(events) if e.get("type") == "response.completed"), None)
    if completed is not None:
        output = (completed.get("response") or {}).get("output")
        streamed = [done[i] for i in sorted(done)]
        if output != streamed:
            listed = [(i or {}).get("type") for i in output or []]
            problems.append(
                f"response.completed lists {len(listed)} item(s), not the {len(streamed)} streamed: "
                f"{listed} vs {[(i or {}).get('type') for i in streamed]}"
            )
        usage = (completed.get("response") or {}).get("usage")
        if not isinstance(usage, dict) or not all(
            isinstance(usage.get(k), int) for k in ("input_tokens", "output_tokens", "total_tokens")
        ):
            problems.append(f"response.completed has no usage: {usage!r}")
    return problems


# ----- client 1: the openai SDK, a loop driven here ----------------------------------------


def _run_tool(item: dict[str, Any], ran: list[int]) -> str:
    step = int(orjson.loads(item["arguments"])["step"])
    ran.append(step)
    return step_output(step)


def sdk_loop(
    base_url: str, task: str, *, stream: bool, headers: dict[str, str], max_turns: int, helper: bool = False
) -> ClientRun:
    """Codex's way: ``store: false``, every turn's output items and the tool outputs appended to
    ``input`` (the reasoning items with their ``encrypted_content``, as received). ``stream``:
    ``responses.create(stream=True)``, its raw events checked here; ``helper``: the SDK's own
    ``responses.stream()`` helper, which builds the response from the events and refuses an
    inconsistent stream."""
    import openai

    # Typed loosely: the input items are plain JSON, as a client that stores them would keep them.
    client: Any = openai.OpenAI(base_url=base_url, api_key=API_KEY, max_retries=0, timeout=CLIENT_TIMEOUT / 2)
    history: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": task}]
    ran: list[int] = []
    problems: list[str] = []
    kinds: set[str] = set()
    options: dict[str, Any] = {
        "model": MODEL,
        "instructions": INSTRUCTIONS,
        "tools": [_tool_schema()],
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "extra_headers": headers,
    }
    try:
        for _turn in range(max_turns):
            if helper:
                with client.responses.stream(input=history, **options) as helper_stream:
                    for event in helper_stream:
                        kinds.add(event.type)
                        if event.type in ("error", "response.failed"):
                            raise StreamFailed(f"the stream ended with {event.to_dict()}", event)
                    final_response = helper_stream.get_final_response()
                output = [item.to_dict() for item in final_response.output]
            elif stream:
                events = []
                with client.responses.create(input=history, stream=True, **options) as response_stream:
                    for event in response_stream:
                        payload = event.to_dict()
                        events.append(payload)
                        if payload.get("type") in ("error", "response.failed"):
                            raise StreamFailed(f"the stream ended with {payload}", payload)
                kinds.update(str(e.get("type")) for e in events)
                completed = next((e for e in events if e.get("type") == "response.completed"), None)
                if completed is None:
                    raise StreamFailed(
                        f"the stream ended without response.completed after {len(events)} events"
                    )
                problems += [f"turn {_turn}: {p}" for p in stream_problems(events)]
                output = completed["response"]["output"]
            else:
                response = client.responses.create(input=history, **options)
                output = [item.to_dict() for item in response.output]
            history += output
            calls = [i for i in output if i.get("type") == "function_call"]
            if not calls:
                # The last message is the answer (a read answer's text may come before it).
                messages = [i for i in output if i.get("type") == "message"]
                final = (
                    "".join(p.get("text", "") for p in messages[-1].get("content") or []) if messages else ""
                )
                return ClientRun(final, ran, history, problems, {"event_types": sorted(kinds)})
            for call in calls:
                history.append(
                    {
                        "type": "function_call_output",
                        "call_id": call["call_id"],
                        "output": _run_tool(call, ran),
                    }
                )
    finally:
        client.close()
    raise AssertionError(f"no final answer after {max_turns} turns")


# ----- client 2: the OpenAI Agents SDK's default (Responses) model --------------------------


async def _agents_run(
    base_url: str, task: str, *, stream: bool, headers: dict[str, str], max_turns: int
) -> ClientRun:
    import openai
    from agents import (
        Agent,
        ModelSettings,
        Runner,
        function_tool,
        set_default_openai_api,
        set_default_openai_client,
        set_tracing_disabled,
    )
    from agents.models import _openai_shared

    set_tracing_disabled(True)
    ran: list[int] = []

    @function_tool
    def run_check(step: int) -> str:
        """Run the scripted check number `step` and return its full log."""
        ran.append(step)
        return step_output(step)

    previous_client = _openai_shared.get_default_openai_client()
    previous_api = _openai_shared.get_use_responses_by_default()
    client = openai.AsyncOpenAI(base_url=base_url, api_key=API_KEY, max_retries=0, timeout=CLIENT_TIMEOUT / 2)
    set_default_openai_client(client, use_for_tracing=False)
    set_default_openai_api("responses")
    agent = Agent(
        name="checker",
        instructions=INSTRUCTIONS,
        tools=[run_check],
        model=MODEL,
        model_settings=ModelSettings(extra_headers=headers),
    )
    kinds: set[str] = set()
    try:
        if stream:
            result: Any = Runner.run_streamed(agent, task, max_turns=max_turns)
            async for event in result.stream_events():
                if event.type == "raw_response_event":
                    kinds.add(str(event.data.type))
            assert kinds, "no raw response events"
        else:
            result = await Runner.run(agent, task, max_turns=max_turns)
        model_names = sorted({type(r).__name__ for r in result.raw_responses})
    finally:
        await client.close()
        _openai_shared.set_default_openai_client(previous_client)  # type: ignore[arg-type]
        _openai_shared.set_use_responses_by_default(previous_api)
    return ClientRun(
        final=str(result.final_output),
        tool_steps=ran,
        history=result.to_input_list(),
        notes={"event_types": sorted(kinds), "responses": model_names, "turns": len(result.raw_responses)},
    )


def agents_run(
    base_url: str, task: str, *, stream: bool, headers: dict[str, str], max_turns: int
) -> ClientRun:
    return asyncio.run(
        asyncio.wait_for(
            _agents_run(base_url, task, stream=stream, headers=headers, max_turns=max_turns), CLIENT_TIMEOUT
        )
    )


# ----- client 3: Codex CLI ---------------------------------------------------------------------


def codex_binary() -> Path | None:
    """Codex CLI ``CODEX_VERSION`` (the version the captured bodies in tests/fixtures/clients come
    from) from npm, installed once into a cache directory (about 420 MB; None without npm)."""
    binary = NPM_CACHE / "node_modules" / ".bin" / "codex"
    if binary.exists():
        version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
        if CODEX_VERSION in version.stdout:
            return binary
    npm = shutil.which("npm")
    if npm is None:
        return None
    NPM_CACHE.mkdir(parents=True, exist_ok=True)
    installed = subprocess.run(
        [
            npm,
            "install",
            "--no-audit",
            "--no-fund",
            "--prefix",
            str(NPM_CACHE),
            f"@openai/codex@{CODEX_VERSION}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if installed.returncode != 0 or not binary.exists():
        pytest.fail(f"npm install @openai/codex@{CODEX_VERSION} failed:\n{installed.stderr[-2000:]}")
    return binary


@dataclass
class CodexRun:
    returncode: int
    stdout: str
    stderr: str
    last_message: str
    rollout: str  # Codex's own session record (its history), JSONL
    seconds: float


def codex_config(base_url: str, *, context_window: int, auto_compact: int | None, retries: bool) -> str:
    """Codex's ``config.toml``: a custom Responses provider at ``base_url``; nothing that reaches
    the network (no update check, analytics, plugin sync or apps: without these four settings
    Codex looks up github.com and chatgpt.com at start); Codex's own compaction at
    ``auto_compact`` tokens (None: never, for practical purposes); its retries off unless
    ``retries`` (then its defaults)."""
    compact = auto_compact if auto_compact is not None else 10 * context_window
    retry = "" if retries else "request_max_retries = 0\nstream_max_retries = 0\n"
    return f"""model_provider = "proxy"
model_context_window = {context_window}
model_auto_compact_token_limit = {compact}
check_for_update_on_startup = false

[analytics]
enabled = false

[features]
plugins = false
apps = false

[model_providers.proxy]
name = "compaction-proxy"
base_url = "{base_url}"
wire_api = "responses"
env_key = "CPX_CODEX_KEY"
stream_idle_timeout_ms = 30000
{retry}"""


def codex_run(
    binary: Path,
    base_url: str,
    task: str,
    tmp: Path,
    *,
    context_window: int = 1_000_000,
    auto_compact: int | None = None,
    retries: bool = False,
    timeout: float = CODEX_TIMEOUT,
) -> CodexRun:
    """``codex exec`` against ``base_url``, in a scratch directory, with its own ``CODEX_HOME``
    (``--strict-config``: a setting this version does not know is an error)."""
    home = tmp / "codex-home"
    work = tmp / "codex-work"
    home.mkdir()
    work.mkdir()
    (home / "config.toml").write_text(
        codex_config(base_url, context_window=context_window, auto_compact=auto_compact, retries=retries)
    )
    last = tmp / "codex-last-message.txt"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "CODEX_HOME": str(home),
        "CPX_CODEX_KEY": API_KEY,
        "RUST_LOG": "warn",
        "NO_COLOR": "1",
        "TERM": "dumb",
    }
    command = [
        str(binary),
        "exec",
        "--strict-config",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "--color",
        "never",
        "-o",
        str(last),
        "-m",
        CODEX_MODEL,
        task,
    ]
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate(timeout=10)
        pytest.fail(f"codex exec did not finish in {timeout:.0f} s\nstderr: {stderr[-3000:]}")
    rollout = "\n".join(p.read_text() for p in sorted((home / "sessions").rglob("*.jsonl")))
    return CodexRun(
        returncode=process.returncode,
        stdout=stdout,
        stderr=stderr,
        last_message=last.read_text() if last.exists() else "",
        rollout=rollout,
        seconds=time.monotonic() - started,
    )


# ----- fixtures and the runs ------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _quiet_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_BASE_URL", "OPENAI_API_BASE", "OPENAI_API_KEY", "OPENAI_AGENTS_DISABLE_TRACING"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")


@pytest.fixture
def responses_upstream() -> Iterator[Callable[..., ResponsesUpstream]]:
    started: list[ResponsesUpstream] = []

    def start(**options: Any) -> ResponsesUpstream:
        server = ResponsesUpstream(**options).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def codex() -> Path:
    binary = codex_binary()
    if binary is None:
        pytest.skip("npm is not installed: Codex CLI (@openai/codex from npm) cannot be installed")
    return binary


@dataclass(frozen=True)
class Client:
    name: str  # sdk, sdk-helper, agents
    stream: bool

    def run(self, base_url: str, task: str) -> ClientRun:
        headers = {RUN_HEADER: f"{self.name}-{'stream' if self.stream else 'plain'}"}
        turns = STEPS * 2 + 10
        if self.name.startswith("sdk"):
            helper = self.name == "sdk-helper"
            return sdk_loop(
                base_url, task, stream=self.stream, headers=headers, max_turns=turns, helper=helper
            )
        return agents_run(base_url, task, stream=self.stream, headers=headers, max_turns=turns)


RUNS = [
    ("openai-sdk-responses.create", Client("sdk", stream=False)),
    ("openai-sdk-responses.create-stream", Client("sdk", stream=True)),
    ("openai-sdk-responses.stream", Client("sdk-helper", stream=True)),
    ("openai-agents-Runner.run", Client("agents", stream=False)),
    ("openai-agents-Runner.run_streamed", Client("agents", stream=True)),
]
CLIENTS = [pytest.param(client, id=name) for name, client in RUNS]


def _failure_cases(runs: list[tuple[str, bool]]) -> Iterator[Any]:
    for name, stream in runs:
        yield pytest.param(name, Failure("status", 500), None, id=f"{name}-http500")
        yield pytest.param(name, Failure("status", 429), None, id=f"{name}-http429")
        yield pytest.param(name, Failure("reset", after_events=6), None, id=f"{name}-reset")
        if stream:
            # The read answer already streamed text to the client when the next round fails.
            yield pytest.param(name, Failure("status", 500), PREAMBLE, id=f"{name}-http500-after-text")


def _task(name: str, steps: int = STEPS) -> str:
    return f"Run the {steps} scripted checks one by one and report when all are done ({name} run)."


def _assert_clean(fake: ResponsesUpstream, window: int, trace: str) -> None:
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
    if fake.follower_changes:  # informational (see ResponsesUpstream._check_followers)
        print(f"{len(fake.follower_changes)} reasoning item(s) came back with another following item:")
        print("\n".join(fake.follower_changes[:10]))


@pytest.mark.parametrize("client", CLIENTS)
def test_long_run_stays_in_the_window(
    client: Client, responses_upstream: Callable[..., ResponsesUpstream], start_proxy: Any
) -> None:
    fake = responses_upstream(window=WINDOW, steps=STEPS, read_every=1)
    proxy = start_proxy({**PROXY_CONFIG, "upstream": {"base_url": fake.base_url}})
    run: ClientRun | None = None
    error: Exception | None = None
    try:
        run = client.run(proxy.base_url, _task(client.name))
    except Exception as exc:  # judged after the model's own records
        error = exc
    trace = fake.summary()
    print(trace)
    _assert_clean(fake, WINDOW, trace)
    assert error is None, f"the client failed: {error!r}\n{trace}"
    assert run is not None
    print(run.notes)
    assert run.final.startswith(DONE_PREFIX), f"final answer {run.final!r}\n{trace}"
    assert run.tool_steps == list(range(1, STEPS + 1))
    conversation = fake.conversation()
    assert conversation.finished and conversation.step == STEPS
    assert run.stream_problems == [], "\n".join(run.stream_problems)
    # Saved outputs were read back, and every read was answered.
    assert fake.reads, f"the proxy never offered read_tool_output with a handle\n{trace}"
    unanswered = len(fake.reads) - len(fake.follow_ups)
    assert unanswered == 0, f"{unanswered} of {len(fake.reads)} read calls got no result\n{trace}"
    # Reasoning items came back (checked byte for byte), the proxy compacted, the client saw none of it.
    assert fake.reasoning_echoed >= STEPS // 2, f"only {fake.reasoning_echoed} reasoning items came back"
    assert max(s.tokens for s in fake.requests) <= WINDOW
    assert _leaks(run.history_text()) == []


@pytest.mark.parametrize("client", [pytest.param(c, id=n) for n, c in RUNS if c.stream])
def test_text_before_a_read_reaches_the_streaming_client_once(
    client: Client, responses_upstream: Callable[..., ResponsesUpstream], start_proxy: Any
) -> None:
    """Read answers that say something first (``reasoning``, a ``message``, the read call): the
    text is relayed as it streams, once per read, in a well-formed stream, and the run goes on."""
    fake = responses_upstream(window=WINDOW, steps=STEPS, read_every=1, read_preamble=PREAMBLE)
    proxy = start_proxy({**PROXY_CONFIG, "upstream": {"base_url": fake.base_url}})
    run = client.run(proxy.base_url, _task(client.name))
    trace = fake.summary()
    _assert_clean(fake, WINDOW, trace)
    assert run.final.startswith(DONE_PREFIX), f"final answer {run.final!r}\n{trace}"
    assert run.tool_steps == list(range(1, STEPS + 1))
    assert run.stream_problems == [], "\n".join(run.stream_problems)
    assert fake.reads
    assert run.history_text().count(PREAMBLE.strip()) == len(fake.reads), trace
    assert _leaks(run.history_text()) == []


@pytest.mark.parametrize("order", ["after", "before"])
@pytest.mark.parametrize("client", [pytest.param(c, id=n) for n, c in RUNS if c.name.startswith("sdk")])
def test_a_mixed_answer_never_runs_the_call_planned_before_the_read(
    client: Client, order: str, responses_upstream: Callable[..., ResponsesUpstream], start_proxy: Any
) -> None:
    """Read answers that also call the client's tool (the read call first, or the client's):
    the proxy resolves the read and asks again without the client's call, so the client runs
    each step once, re-issued after the read, and never sees the dropped call."""
    fake = responses_upstream(window=WINDOW, steps=STEPS, read_every=1, mixed=order)
    proxy = start_proxy({**PROXY_CONFIG, "upstream": {"base_url": fake.base_url}})
    run = client.run(proxy.base_url, _task(client.name))
    trace = fake.summary()
    _assert_clean(fake, WINDOW, trace)
    assert run.final.startswith(DONE_PREFIX), f"final answer {run.final!r}\n{trace}"
    assert run.tool_steps == list(range(1, STEPS + 1)), f"steps run: {run.tool_steps}\n{trace}"
    assert run.stream_problems == [], "\n".join(run.stream_problems)
    assert fake.mixed_calls, trace
    history = run.history_text()
    assert [c for c in fake.mixed_calls if c in history] == [], "a dropped call reached the client"
    assert _leaks(history) == []


@pytest.mark.parametrize("client", [pytest.param(c, id=n) for n, c in RUNS if c.name == "agents"])
def test_direct_without_the_proxy_the_run_fails_with_the_context_error(
    client: Client, responses_upstream: Callable[..., ResponsesUpstream]
) -> None:
    """The acceptance criterion's other half: the same run, straight to the model, fails."""
    import openai

    fake = responses_upstream(window=WINDOW, steps=STEPS, read_every=1)
    with pytest.raises(openai.BadRequestError) as caught:
        client.run(fake.base_url, _task(client.name))
    assert caught.value.status_code == 400
    assert caught.value.code == "context_length_exceeded"
    assert fake.rejected and fake.requests[-1].kind == "rejected"
    assert fake.conversation().step < STEPS


@pytest.mark.parametrize(
    "name, failure, preamble", list(_failure_cases([(name, client.stream) for name, client in RUNS]))
)
def test_a_failed_read_round_reaches_the_client_as_an_error(
    name: str,
    failure: Failure,
    preamble: str | None,
    responses_upstream: Callable[..., ResponsesUpstream],
    start_proxy: Any,
) -> None:
    import openai

    client = dict(RUNS)[name]
    fake = responses_upstream(
        window=UNLIMITED,
        steps=STEPS,
        read_every=1,
        fail_read_follow_up=1,
        failure=failure,
        read_preamble=preamble,
    )
    proxy = start_proxy({**PROXY_CONFIG, "upstream": {"base_url": fake.base_url}})
    run: ClientRun | None = None
    error: Exception | None = None
    try:
        run = client.run(proxy.base_url, _task(client.name))
    except Exception as exc:
        error = exc
    trace = fake.summary()
    print(f"client error: {error!r}\n{trace}")
    assert fake.failures_injected == 1, f"no read follow-up round was failed\n{trace}"
    assert fake.problems == [], "\n".join(fake.problems)
    assert error is not None, (
        f"the client completed as if nothing failed: final answer {run.final if run else None!r} "
        f"after {len(run.tool_steps) if run else 0} steps\n{trace}"
    )
    assert "timeout" not in type(error).__name__.lower(), f"the client hung instead: {error!r}"
    if preamble is None:
        # Nothing reached the client yet (a round that only reads sends nothing): the upstream's
        # own status, streamed or not (a reset before the answer is the proxy's 502).
        expected = failure.status if failure.kind == "status" else 502
        assert isinstance(error, openai.APIStatusError), f"{error!r}"
        assert error.status_code == expected, f"{error!r}"
    elif client.name.startswith("sdk"):
        # Text already streamed: the stream ends with an error event, never response.completed.
        assert isinstance(error, StreamFailed) and error.event is not None, f"{error!r}"
    else:
        # The Agents SDK raises on the stream's error event (ModelBehaviorError in 0.24).
        assert "terminal event `error`" in str(error), f"{error!r}"
    # The run stopped there: nothing was asked after the failed round.
    assert not fake.conversation().finished
    assert fake.requests[-1].kind == "failed", trace


# ----- Codex CLI -----------------------------------------------------------------------------


def _codex_errors(run: CodexRun) -> list[str]:
    return [line for line in run.stderr.splitlines() if line.startswith("ERROR")]


def _codex_trace(fake: ResponsesUpstream, run: CodexRun) -> str:
    quiet = "\n".join(line for line in run.stderr.splitlines() if STEP_MARK not in line)
    return (
        f"{fake.summary()}\nexit {run.returncode} in {run.seconds:.1f} s; last message {run.last_message!r}\n"
        f"stderr without the step outputs (tail): {quiet[-2500:]}"
    )


def _codex_steps(rollout: str) -> list[int]:
    """The scripted steps whose output Codex recorded as its own tool results."""
    steps: list[int] = []
    for line in rollout.splitlines():
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        payload = record.get("payload") if isinstance(record, dict) else None
        if isinstance(payload, dict) and payload.get("type") == "function_call_output":
            output = orjson.dumps(payload.get("output")).decode()
            found = [int(s) for s in STEP_LINE.findall(output)]
            steps += sorted(set(found))
    return steps


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
    run = codex_run(codex, proxy.base_url, _task("codex", CODEX_STEPS), tmp_path)
    trace = _codex_trace(fake, run)
    print(trace)
    compactions = [s for s in fake.requests if s.request_kind == "compaction"]
    print(f"Codex's own compaction requests: {[s.index for s in compactions]}; other routes: {fake.others}")
    tools = [t.get("name", t.get("type")) for t in fake.requests[0].body.get("tools") or []]
    print(f"Codex's tools: {tools}")
    assert "exec_command" in tools, tools
    _assert_clean(fake, CODEX_WINDOW, trace)
    assert run.returncode == 0, trace
    assert run.last_message.strip().startswith(DONE_PREFIX), trace
    assert DONE_PREFIX in run.stdout
    conversation = fake.conversation()
    assert conversation.finished and conversation.step == CODEX_STEPS, trace
    # Codex really ran every step's shell command, in order, and recorded its output.
    assert _codex_steps(run.rollout) == list(range(1, CODEX_STEPS + 1)), trace
    assert fake.reads, f"the proxy never offered read_tool_output with a handle\n{trace}"
    assert len(fake.reads) == len(fake.follow_ups), trace
    # The proxy compacted: without it the run would have needed far more than the window.
    assert any("handle=out_" in orjson.dumps(s.body["input"]).decode() for s in fake.requests), trace
    assert fake.reasoning_echoed >= CODEX_STEPS // 2
    # Codex's own history never saw the read tool or a placeholder.
    assert run.rollout, "Codex wrote no session record"
    assert _leaks(run.rollout) == [], trace


def test_codex_cli_direct_without_the_proxy_fails_with_the_context_error(
    codex: Path, responses_upstream: Callable[..., ResponsesUpstream], tmp_path: Path
) -> None:
    fake = responses_upstream(window=CODEX_WINDOW, steps=CODEX_STEPS, read_every=1)
    run = codex_run(codex, fake.base_url, _task("codex", CODEX_STEPS), tmp_path)
    trace = _codex_trace(fake, run)
    print(trace)
    assert fake.rejected, trace
    assert not fake.conversation().finished, trace
    assert run.returncode != 0, trace
    assert any("context window" in line for line in _codex_errors(run)), trace
    assert not run.last_message.strip().startswith(DONE_PREFIX), trace


CODEX_FAILURES = list(_failure_cases([("codex-exec", True)]))


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
    run = codex_run(codex, proxy.base_url, _task("codex", CODEX_STEPS), tmp_path)
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
        _task("codex", CODEX_STEPS),
        tmp_path,
        context_window=CODEX_WINDOW,
        auto_compact=CODEX_AUTO_COMPACT,
    )
    trace = _codex_trace(fake, run)
    print(trace)
    compactions = [s for s in fake.requests if s.kind == "summary"]
    print(f"Codex's own compaction requests: {[(s.index, s.request_kind, s.tokens) for s in compactions]}")
    _assert_clean(fake, CODEX_WINDOW, trace)
    assert run.returncode == 0, trace
    assert run.last_message.strip().startswith(DONE_PREFIX), trace
    assert compactions, f"Codex never compacted by itself\n{trace}"
    assert any(s.handles for s in fake.requests), f"the proxy never compacted\n{trace}"
    assert all(s.request_kind == "compaction" for s in compactions), trace
    assert fake.conversation().finished, trace
    assert _leaks(run.rollout) == [], trace


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
    run = codex_run(codex, proxy.base_url, _task("codex", CODEX_STEPS), tmp_path, retries=True)
    trace = _codex_trace(fake, run)
    print(trace)
    assert fake.failures_injected == 1, trace
    _assert_clean(fake, CODEX_WINDOW, trace)
    assert run.returncode == 0, trace
    assert run.last_message.strip().startswith(DONE_PREFIX), trace
    assert fake.conversation().finished and fake.conversation().step == CODEX_STEPS, trace
