"""A credential goes only where its client sent it: a model summarizer on the OpenAI upstream
never receives the bearer token a client presented to the Anthropic door (Claude Code's OAuth
``Authorization: Bearer``), while a chat client's key still reaches a summarizer on the very
host the client addressed."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from tests.anthropic_upstream.server import AnthropicUpstream
from tests.fake_upstream import FakeUpstream, Reply, completion

pytestmark = pytest.mark.e2e

ANTHROPIC_TOKEN = "sk-ant-oat01-client-secret-for-anthropic-only"
OPENAI_KEY = "sk-openai-client-key"
SUMMARY = "## Goal\nFix the parser.\n## Evidence\nThe tests ran."


def history(steps: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Fix the failing test in tests/test_parse.py"}
    ]
    for i in range(steps):
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": {"command": f"ls {i}"}}
                ],
            }
        )
        output = "\n".join(f"step {i} line {j}: output of the command" for j in range(60))
        messages.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": output}],
            }
        )
    messages.append({"role": "user", "content": "Go on."})
    return messages


def summarizer_calls(upstream: FakeUpstream) -> list[Any]:
    return [
        r for r in upstream.requests if r.path.endswith("/chat/completions") and b"summar" in r.body.lower()
    ]


def test_an_anthropic_token_never_reaches_the_openai_summarizer(
    start_proxy: Any, upstream: FakeUpstream
) -> None:
    anthropic = AnthropicUpstream(window=200_000, steps=1).start()
    try:
        upstream.queue(*(Reply(body=completion(SUMMARY, model="small-model")) for _ in range(4)))
        proxy = start_proxy(
            {
                "policy": "improved",
                "anthropic": {"base_url": anthropic.base_url},
                # Asked at the point itself (prepare_at null), where the credential is chosen.
                "summarizer": {"kind": "openai", "model": "small-model", "prepare_at": None},
                "context_windows": {"default": 8_000},
            }
        )
        body = {"model": "claude-sonnet-4-5", "max_tokens": 512, "messages": history(30)}
        response = httpx.post(
            proxy.url + "/v1/messages",
            content=orjson.dumps(body),
            headers={
                "authorization": f"Bearer {ANTHROPIC_TOKEN}",
                "anthropic-version": "2023-06-01",
                "content-type": "application/json",
            },
            timeout=30,
        )
        assert response.headers.get("x-compaction-trigger"), response.text[:300]
        calls = summarizer_calls(upstream)
        assert calls, "the model summarizer was not asked"
        for call in calls:
            assert ANTHROPIC_TOKEN not in repr(call.raw_headers) and ANTHROPIC_TOKEN not in call.body.decode()
    finally:
        anthropic.stop()


def test_a_chat_clients_key_still_reaches_a_summarizer_on_its_own_upstream(
    start_proxy: Any, upstream: FakeUpstream
) -> None:
    upstream.queue(
        *(Reply(body=completion(SUMMARY, model="small-model")) for _ in range(4)),
        Reply(body=completion("ok")),
    )
    proxy = start_proxy(
        {
            "policy": "improved",
            "summarizer": {"kind": "openai", "model": "small-model", "prepare_at": None},
            "context_windows": {"default": 8_000},
        }
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test"}]
    for i in range(30):
        call = {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "bash", "arguments": '{"command": "ls"}'},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append(
            {"role": "tool", "tool_call_id": f"c{i}", "content": "\n".join(f"line {j}" for j in range(60))}
        )
    messages.append({"role": "user", "content": "Go on."})
    response = httpx.post(
        proxy.url + "/v1/chat/completions",
        json={"model": "gpt-4o", "messages": messages},
        headers={"authorization": f"Bearer {OPENAI_KEY}"},
        timeout=30,
    )
    assert response.headers.get("x-compaction-trigger"), response.text[:300]
    calls = summarizer_calls(upstream)
    assert calls and all(call.headers.get("authorization") == f"Bearer {OPENAI_KEY}" for call in calls)
