"""The fake model's prefix cache (``tests/agent_upstream/prefix_cache.py``): cached tokens as
OpenAI reports them, the longest common prefix with a recent prompt, from 1,024 tokens on, in
steps of 128; off by default."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np

from tests.agent_upstream import AgentUpstream
from tests.agent_upstream.prefix_cache import PrefixCache, cacheable, common_prefix
from tests.agent_upstream.script import ScriptedModel

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "execute_bash",
            "description": "Run a command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def text(label: str, lines: int = 120) -> str:
    return "\n".join(f"{label} line {n}: the value of item {n * 7} is {n * 13 % 97}" for n in range(lines))


def body(*contents: str, tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    messages = [{"role": "system", "content": contents[0]}]
    messages += [{"role": "user", "content": c} for c in contents[1:]]
    return {"model": "agent-model", "messages": messages, "tools": tools or TOOLS}


def test_cacheable_counts_from_1024_tokens_in_steps_of_128() -> None:
    assert [cacheable(n) for n in (0, 1023, 1024, 1151, 1152, 5000)] == [0, 0, 1024, 1024, 1152, 4992]


def test_common_prefix() -> None:
    a = np.array([1, 2, 3, 4])
    assert common_prefix(a, np.array([1, 2, 9])) == 2
    assert common_prefix(a, np.array([1, 2])) == 2
    assert common_prefix(a, np.array([], dtype=np.int64)) == 0
    assert common_prefix(a, a.copy()) == 4


def test_a_change_in_a_message_keeps_the_tokens_before_it() -> None:
    model = ScriptedModel(prefix_cache=True)
    cache = model.prefix_cache
    assert isinstance(cache, PrefixCache)
    first = body(text("system"), text("task"), text("step one"))
    edited = body(text("system"), text("task"), text("step two"))
    before_edit = sum(cache.counted(first)[:3])  # tools, system, task: as the prompt counts them
    assert before_edit > 1024
    assert cache.serve(first) == 0  # nothing earlier
    cached = cache.serve(edited)
    assert cached % 128 == 0 and before_edit - 128 < cached <= before_edit + 10
    assert cached < model.counter.count_request(edited).total
    # Appending keeps the whole earlier prompt (in the prompt's own count).
    grown = body(text("system"), text("task"), text("step two"), text("step three"))
    assert cache.serve(grown) == sum(cache.counted(edited)) // 128 * 128


def test_a_changed_tool_list_misses_the_cache_and_a_short_prefix_counts_nothing() -> None:
    cache = PrefixCache(ScriptedModel().counter)
    cache.serve(body(text("system"), text("task")))
    other_tools = [*TOOLS, {"type": "function", "function": {"name": "think", "parameters": {}}}]
    assert cache.serve(body(text("system"), text("task"), tools=other_tools)) == 0
    small = PrefixCache(ScriptedModel().counter)
    small.serve(body(text("system", 10), text("task")))
    assert small.serve(body(text("system", 10), text("other task"))) == 0


def test_the_horizon_forgets_older_prompts() -> None:
    cache = PrefixCache(ScriptedModel().counter, horizon=2)
    cache.serve(body(text("alpha")))
    cache.serve(body(text("beta")))
    cache.serve(body(text("gamma")))
    assert cache.serve(body(text("alpha"), text("more"))) == 0
    assert cache.serve(body(text("gamma"), text("more"))) > 0


def test_the_common_prefix_is_told_in_the_prompts_own_count() -> None:
    cache = PrefixCache(ScriptedModel().counter)
    request = body(text("system"), text("task"))
    canonical_ends = [len(cache.tokens(body(text("system")))), len(cache.tokens(request))]
    counted = cache.counted(request)
    assert cache.common_counted(request, canonical_ends[0]) == sum(counted[:2])
    assert cache.common_counted(request, canonical_ends[0] + 5) == sum(counted[:2]) + 5
    assert cache.common_counted(request, 10**9) == sum(counted)
    assert cache.common_counted(request, 0) == 0


def ask(upstream: AgentUpstream, request: dict[str, Any], stream: bool = False) -> dict[str, Any]:
    payload = {**request, "stream": stream}
    if stream:
        payload["stream_options"] = {"include_usage": True}
    with httpx.Client(trust_env=False, timeout=30) as client:
        response = client.post(f"{upstream.base_url}/chat/completions", json=payload)
        assert response.status_code == 200, response.text
        if not stream:
            usage: dict[str, Any] = response.json()["usage"]
            return usage
        chunks = [line[6:] for line in response.text.splitlines() if line.startswith("data: {")]
        last: dict[str, Any] = httpx.Response(200, content=chunks[-1]).json()["usage"]
        return last


def test_the_server_reports_cached_tokens_only_when_asked() -> None:
    request = body(text("system"), text("task"))
    grown = body(text("system"), text("task"), text("more"))
    plain = AgentUpstream(window=100_000).start()
    try:
        ask(plain, request)
        assert ask(plain, grown)["prompt_tokens_details"]["cached_tokens"] == 0
    finally:
        plain.stop()
    caching = AgentUpstream(window=100_000, prefix_cache=True).start()
    try:
        assert ask(caching, request)["prompt_tokens_details"]["cached_tokens"] == 0
        usage = ask(caching, grown, stream=True)
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        assert 1024 <= cached <= usage["prompt_tokens"] and cached % 128 == 0
        assert [s.cached for s in caching.requests] == [0, cached]
    finally:
        caching.stop()
