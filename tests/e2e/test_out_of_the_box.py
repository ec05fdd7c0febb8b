"""It compacts out of the box: ``compaction-proxy serve`` with no configuration file at all (only
the upstream's URL, as a newcomer gives it), in front of a local model server at an 8k window
that enforces it in its own words, drives a real agent (the OpenAI Agents SDK) through a
60-step session with no error ever reaching the client.

The server is ``tests.agent_upstream.AgentUpstream`` playing vLLM, llama.cpp, Ollama or LM
Studio: it tells its window where that server does (``/v1/models`` ``max_model_len``,
``/props``, ``/api/show``, ``/api/v0/models``) or only in its refusal of a request over it. The
model's name is one the built-in table does not know, so without what the server tells, the
proxy would take it for a 128k model and never compact.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.agent_upstream import DONE_PREFIX, RUN_HEADER, AgentUpstream
from tests.e2e.clients import MODEL, openai_agents
from tests.fake_upstream import free_port

pytestmark = [pytest.mark.e2e]

WINDOW = 8192
STEPS = 60


class BareProxy:
    """``compaction-proxy serve`` run as a newcomer runs it: no --config, no file, in an empty
    directory, the upstream given by its environment variable."""

    def __init__(self, workdir: Path, upstream_url: str) -> None:
        self.workdir = workdir
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_PROXY_")}
        env["COMPACTION_PROXY_UPSTREAM_URL"] = upstream_url
        self.log = (workdir / "serve.log").open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "proxy.cli", "serve", "--port", str(self.port)],
            cwd=workdir,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (workdir / "serve.log").read_text()
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1, trust_env=False).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.05)
        raise AssertionError("the proxy did not become ready")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        self.log.close()


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[object]]:
    started: list[object] = []
    yield started
    for server in started:
        server.stop()  # type: ignore[attr-defined]


CASES = [
    pytest.param("vllm", "vllm", False, id="vllm-max_model_len"),
    pytest.param("vllm", "none", False, id="vllm-refusal-only"),
    pytest.param("llamacpp", "llamacpp", True, id="llamacpp-props-stream"),
    pytest.param("ollama", "ollama", False, id="ollama-api-show"),
    pytest.param("lmstudio", "none", True, id="lmstudio-refusal-only-stream"),
]


@pytest.mark.parametrize(("flavor", "metadata", "stream"), CASES)
def test_a_60_step_session_at_8k_completes_with_no_configuration(
    tmp_path: Path, servers: list[object], flavor: str, metadata: str, stream: bool
) -> None:
    model = AgentUpstream(window=WINDOW, steps=STEPS, read_every=3, flavor=flavor, metadata=metadata).start()
    servers.append(model)
    proxy = BareProxy(tmp_path, model.base_url)
    servers.append(proxy)
    task = f"Run the {STEPS} scripted checks one by one and report when all are done."
    run = openai_agents.run(
        f"{proxy.url}/v1",
        task,
        stream=stream,
        max_turns=STEPS * 2 + 10,
        headers={RUN_HEADER: f"{flavor}-{metadata}"},
        timeout=300.0,
    )
    trace = model.summary()
    # The agent finished, every step run once in order, and never saw an error.
    assert run.final.startswith(DONE_PREFIX), f"final answer {run.final!r}\n{trace}"
    assert run.tool_steps == list(range(1, STEPS + 1))
    assert model.problems == [], "\n".join(model.problems)
    assert model.task_not_kept == []
    # Told by its metadata, the server never had to refuse anything; told only by a refusal, it
    # refused once (the proxy then compacted that request to the window and sent it again).
    refused = len(model.rejected)
    assert refused == (0 if metadata != "none" else 1), f"{refused} refusals\n{trace}"
    learned = orjson.loads((tmp_path / "var" / "learned_windows.json").read_bytes())
    (told,) = [models[MODEL] for models in learned.values() if MODEL in models]
    assert told["window"] == WINDOW
    assert told["source"].startswith("refusal" if metadata == "none" else ("GET", "POST"))
    print(
        f"\nout-of-the-box {flavor}/{metadata}: {STEPS} steps, {len(model.requests)} requests, "
        f"largest {model.max_tokens_seen} of {WINDOW} tokens, {refused} refusal(s), "
        f"learned from {told['source']}"
    )
