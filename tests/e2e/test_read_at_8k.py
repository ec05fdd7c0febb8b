"""Reading back at an 8k window, through the running proxy, from a scripted model that enforces
the window (``tests.agent_upstream``): a model that asks for every named handle at once gets
every one back (at least its first lines, with the exact arguments of the rest), and a ``*``
search for a fact printed in an OLD output finds it first when its line matches every term of
the pattern, though newer outputs are full of lines that match one."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.agent_upstream import DONE_PREFIX, READ_TOOL, RUN_HEADER, AgentUpstream
from tests.proxy.data_plane.chat_wire import BASH

pytestmark = pytest.mark.e2e

WINDOW = 8192
STEPS = 10
FACT = "dev server started: pid=48213 port=8765 seed=1337 scratch=/tmp/run-7f3a"
NUMBERED = re.compile(r"^ *\d+\| ", re.M)
REST = re.compile(r"\{\"handle\":\"(out_[0-9a-f]+)\",\"start_line\":\d+,\"num_lines\":\d+\}")


def output(step: int) -> str:
    """What the agent's step prints: its first step the fact, every later one lines naming a
    pid or a port (the noise a search for the fact meets first, newest first)."""
    lines = [
        f"step {step} line {n}: " + (f"worker pid={4000 + n} ready" if n % 2 else f"port {9000 + n} probed")
        for n in range(90)
    ]
    if step == 1:
        lines[60] = FACT
    return "\n".join(lines)


def run_agent(proxy: Any, run: str) -> list[Any]:
    """The agent's loop: each call of its tool answered with the step's output, to the end."""
    messages: list[Any] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"Run the {STEPS} checks and report."},
    ]
    for _ in range(STEPS + 2):
        response = httpx.post(
            f"{proxy.base_url}/chat/completions",
            json={"model": "agent-model", "messages": messages, "tools": [BASH], "max_tokens": 512},
            headers={RUN_HEADER: run, "authorization": "Bearer sk-reads-00000000000000"},
            timeout=60,
        )
        assert response.status_code == 200, response.text
        message = response.json()["choices"][0]["message"]
        messages.append(message)
        calls = message.get("tool_calls") or []
        if not calls:
            assert (message.get("content") or "").startswith(DONE_PREFIX)
            return messages
        step = sum(1 for m in messages if m["role"] == "tool") + 1
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": output(step)} for c in calls]
    raise AssertionError("the run did not finish")


@pytest.fixture
def model() -> Iterator[AgentUpstream]:
    started: list[AgentUpstream] = []

    def start(**options: Any) -> AgentUpstream:
        server = AgentUpstream(window=WINDOW, steps=STEPS, **options).start()
        started.append(server)
        return server

    yield start  # type: ignore[misc]
    for server in started:
        server.stop()


def read_results(follow_up: Any) -> dict[str, str]:
    """The read calls of a read follow-up round and their results, by the handle asked."""
    messages = follow_up.body["messages"]
    asked = {
        call["id"]: orjson.loads(call["function"]["arguments"])["handle"]
        for m in messages
        if m["role"] == "assistant"
        for call in m.get("tool_calls") or []
        if call["function"]["name"] == READ_TOOL
    }
    return {asked[m["tool_call_id"]]: m["content"] for m in messages if m.get("tool_call_id") in asked}


def test_a_model_that_asks_for_every_named_handle_at_once_gets_every_one_back(
    start_proxy: Any, model: Any
) -> None:
    upstream = model(read_every=7, read_all_handles=True, read_arguments=[{}])
    proxy = start_proxy(
        {
            "policy": "improved",
            "context_windows": {"default": WINDOW},
            "upstream": {"base_url": upstream.base_url},
        }
    )
    run_agent(proxy, "every-handle")
    assert upstream.rejected == [] and upstream.problems == []
    (read,) = upstream.reads
    asked = read.handles
    assert len(asked) >= 3, upstream.summary()
    (follow_up,) = [s for s in upstream.follow_ups if s.index == read.index + 1]
    results = read_results(follow_up)
    assert sorted(results) == sorted(asked[:8])
    for handle, text in results.items():
        assert text.startswith(f"handle={handle}: lines 1-"), text[:200]
        assert NUMBERED.search(text), text[:300]  # content, not "no room"
        if "lines 1-90 of 90" not in text.splitlines()[0] or "Output limited" in text:
            assert REST.search(text) and REST.search(text).group(1) == handle  # type: ignore[union-attr]
    assert follow_up.budget <= WINDOW


def test_a_search_finds_a_fact_in_an_old_output_first_when_it_matches_every_term(
    start_proxy: Any, model: Any
) -> None:
    upstream = model(read_every=9, read_arguments=[{"handle": "*", "pattern": "pid|port|seed"}])
    proxy = start_proxy(
        {
            "policy": "improved",
            "context_windows": {"default": WINDOW},
            "upstream": {"base_url": upstream.base_url},
        }
    )
    run_agent(proxy, "search")
    assert upstream.rejected == [] and upstream.problems == []
    (read,) = upstream.reads
    (follow_up,) = [s for s in upstream.follow_ups if s.index == read.index + 1]
    (text,) = read_results(follow_up).values()
    first_line = NUMBERED.search(text)
    assert first_line is not None and text[first_line.end() :].startswith(FACT), text[:600]
    assert "left out for room" in text and '"pattern":"pid|port|seed"' in text
    assert follow_up.budget <= WINDOW
