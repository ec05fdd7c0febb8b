"""The model summarizer against a real local fake server and respx: success, timeout, 500,
garbage, and the per-session circuit breaker; and its fallback inside a policy."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import respx

from policies.ledger_extraction import build_ledger
from policies.pipeline import build_policy
from policies.summarizer import SummaryRequest
from policies.tokens import TokenCounter
from proxy.config.settings import SummarizerSettings
from proxy.summaries.credentials import bearer
from proxy.summaries.summarizer import BreakerOpen, OpenAISummarizer, SummarizerError
from tests.fake_upstream import FakeUpstream, Reply, completion

HISTORY: list[Any] = [
    {"role": "system", "content": "You fix bugs."},
    {"role": "user", "content": "Fix the parser in src/parse.py"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "execute_bash", "arguments": '{"command": "pytest -q"}'},
            }
        ],
    },
    {
        "role": "tool",
        "tool_call_id": "c1",
        "name": "execute_bash",
        "content": "1 failed, 49 passed in 8.42s\n[exit code 1]",
    },
]
# The credential a session's summaries are paid with (credentials.py decides it per client).
PAID = bearer("sk-summarizer")
GOOD = "## Goal\nFix the parser.\n## Evidence\nThe test run shows 1 failed, 49 passed."


def request() -> SummaryRequest:
    return SummaryRequest(
        previous_summary=None, messages=HISTORY[2:], ledger=build_ledger(HISTORY), prompt_family="hybrid_v2"
    )


def make(base_url: str, **overrides: Any) -> OpenAISummarizer:
    settings = SummarizerSettings(
        kind="openai", model="small-model", timeout=overrides.pop("timeout", 2.0), **overrides
    )
    return OpenAISummarizer(settings, base_url=base_url, api_key="sk-summarizer")


async def test_success_against_a_real_local_server(upstream: FakeUpstream) -> None:
    upstream.queue(Reply(body=completion(GOOD, model="small-model")))
    summarizer = make(upstream.base_url)
    result = await summarizer.for_session("s", PAID).summarize(request())
    await summarizer.aclose()
    assert result.text == GOOD
    assert (result.model, result.prompt_family, result.prompt_version) == ("small-model", "hybrid_v2", "2")
    assert result.input_tokens == 10 and result.output_tokens == 2
    sent = upstream.requests[-1]
    assert sent.headers["authorization"] == "Bearer sk-summarizer"
    body = sent.json()
    assert body["model"] == "small-model" and body["temperature"] == 0
    assert "## Conversation to summarize" in body["messages"][1]["content"]
    assert "1 failed, 49 passed" in body["messages"][1]["content"]


async def test_timeout_is_a_failure_after_retries(upstream: FakeUpstream) -> None:
    upstream.queue(Reply(kind="hang"), Reply(kind="hang"))
    summarizer = make(upstream.base_url, timeout=0.2, max_retries=1)
    with pytest.raises(SummarizerError, match="timed out"):
        await summarizer.for_session("s", PAID).summarize(request())
    await summarizer.aclose()
    assert len(upstream.requests) == 2


@respx.mock
async def test_500_is_retried_then_succeeds() -> None:
    route = respx.post("http://summarizer.test/v1/chat/completions").mock(
        side_effect=[httpx.Response(500, json={"error": {}}), httpx.Response(200, json=completion(GOOD))]
    )
    summarizer = make("http://summarizer.test/v1", max_retries=2)
    result = await summarizer.for_session("s", PAID).summarize(request())
    await summarizer.aclose()
    assert result.text == GOOD and route.call_count == 2


@respx.mock
@pytest.mark.parametrize(
    ("response", "reason"),
    [
        (httpx.Response(200, content=b"<html>oops</html>"), "not a chat completion"),
        (httpx.Response(200, json={"choices": []}), "not a chat completion"),
        (httpx.Response(200, json=completion("ok")), "empty or too short"),
        (httpx.Response(401, json={"error": {"message": "bad key"}}), "HTTP 401"),
    ],
)
async def test_garbage_and_refusals_are_failures(response: httpx.Response, reason: str) -> None:
    respx.post("http://summarizer.test/v1/chat/completions").mock(return_value=response)
    summarizer = make("http://summarizer.test/v1", max_retries=0)
    with pytest.raises(SummarizerError, match=reason):
        await summarizer.for_session("s", PAID).summarize(request())
    await summarizer.aclose()


@respx.mock
async def test_cut_off_answer_is_a_failure() -> None:
    cut = completion(GOOD)
    cut["choices"][0]["finish_reason"] = "length"
    respx.post("http://summarizer.test/v1/chat/completions").mock(return_value=httpx.Response(200, json=cut))
    summarizer = make("http://summarizer.test/v1", max_retries=0)
    with pytest.raises(SummarizerError, match="cut off"):
        await summarizer.for_session("s", PAID).summarize(request())
    await summarizer.aclose()


@respx.mock
async def test_circuit_breaker_opens_per_session_after_three_failures() -> None:
    route = respx.post("http://summarizer.test/v1/chat/completions").mock(return_value=httpx.Response(503))
    summarizer = make("http://summarizer.test/v1", max_retries=0, breaker_failures=3, breaker_cooldown=60)
    session = summarizer.for_session("s1", PAID)
    for _ in range(3):
        with pytest.raises(SummarizerError, match="HTTP 503"):
            await session.summarize(request())
    with pytest.raises(BreakerOpen):
        await summarizer.for_session("s1", PAID).summarize(request())
    assert route.call_count == 3
    # Another session is not affected.
    with pytest.raises(SummarizerError, match="HTTP 503"):
        await summarizer.for_session("s2", PAID).summarize(request())
    assert route.call_count == 4
    await summarizer.aclose()


@respx.mock
async def test_a_failing_summarizer_falls_back_to_the_ledger_inside_a_policy() -> None:
    respx.post("http://summarizer.test/v1/chat/completions").mock(return_value=httpx.Response(500))
    summarizer = make("http://summarizer.test/v1", max_retries=0)
    history = [
        *HISTORY,
        {"role": "assistant", "content": "Now I look at the file." * 200},
        {"role": "user", "content": "Continue."},
    ]
    policy = build_policy("t", "", [{"auto_compact": {"trigger": 0.1}}], safeguard=False)
    outcome = await policy.apply(
        {"model": "gpt-4o", "messages": history},
        TokenCounter(),
        window=4096,
        summarizer=summarizer.for_session("s", PAID),
    )
    await summarizer.aclose()
    assert outcome.facts.summary.fallback_reason == "summarizer answered HTTP 500"
    summary = outcome.messages[1]["content"]  # type: ignore[index]
    assert "1 failed, 49 passed in 8.42s" in summary and "pytest -q` -> 1" in summary


def test_prompt_families_are_versioned_files() -> None:
    from policies.prompts import FAMILIES, load_prompt

    for family in FAMILIES:
        prompt = load_prompt(family)
        assert prompt.family == family and prompt.version and len(prompt.text) > 100
    with pytest.raises(ValueError, match="unknown prompt family"):
        load_prompt("nope")
    asyncio.get_event_loop_policy()


async def test_input_is_clipped_to_the_summarizer_models_window(upstream: FakeUpstream) -> None:
    # A history far longer than a small summarizer model takes: long outputs are shortened,
    # the oldest messages left out, the newest kept; the whole input stays within the limit.
    history = [{"role": "user", "content": "Fix the parser."}]
    for i in range(40):
        history.append({"role": "assistant", "content": f"step {i}: run the tests"})
        history.append({"role": "user", "content": f"output {i}\n" + "x = 1\n" * 3000})
    big = SummaryRequest(previous_summary=None, messages=history, ledger=build_ledger(history))
    upstream.queue(Reply(body=completion(GOOD, model="small-model")))
    summarizer = make(upstream.base_url, max_input_tokens=6000, max_output_tokens=400)
    await summarizer.for_session("s", PAID).summarize(big)
    await summarizer.aclose()
    content = "".join(m["content"] for m in upstream.requests[-1].json()["messages"])
    assert len(content) <= (6000 - 400) * 3
    assert "earlier messages omitted to fit the summarizer's input" in content
    assert "output 39" in content and "output 0\n" not in content
