"""The fake Anthropic Messages API (``tests.anthropic_upstream``) driven DIRECTLY, without the proxy,
by the official ``anthropic`` SDK: proof that it behaves like the real server, so that the
through-the-proxy tests can trust what it accepts and refuses.

The SDK runs the agent loop of ``tests/e2e/clients/anthropic_sdk_loop.py`` in each of its ways
(create, async, raw stream, the stream helper) and sees the real wire format, prompt caching (the
moving breakpoint reads what the request before it cached) and ``count_tokens`` (the prompt count
of every answer, not an OpenAI count). A long run at a small window gets the real context error,
worded as the real API words it, and the SDK sees the real error classes (``BadRequestError``,
``AuthenticationError``, ``RateLimitError`` honouring ``retry-after``, ``InternalServerError``,
``OverloadedError``, a mid-stream ``error`` event, a reset). The protocol checks and the scripted
agent are in ``test_anthropic_fake_protocol.py``; Claude Code against the fake is in
``test_claude_code_direct.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import anthropic
import orjson
import pytest

from tests.anthropic_upstream import (
    DONE_PREFIX,
    RUN_HEADER,
    AnthropicUpstream,
    Failure,
    count_tokens,
    step_output,
)
from tests.anthropic_upstream.tokens import TOOLS_PROMPT_TOKENS, ClaudeTokenizer
from tests.e2e.clients import anthropic_sdk_loop as sdk
from tests.e2e.clients.anthropic_fake_helpers import (
    CONTEXT_ERROR,
    FIXTURES,
    TASK,
    _body,
    _client,
    _error,
    _post,
    started_fakes,
)

pytestmark = pytest.mark.e2e


@pytest.fixture
def fake() -> Iterator[Callable[..., AnthropicUpstream]]:
    yield from started_fakes()


# ----- the SDK's ways, the wire format, usage and caching --------------------------------------


@pytest.mark.parametrize("variant", sdk.VARIANTS)
def test_each_sdk_variant_completes_a_run(
    fake: Callable[..., AnthropicUpstream], variant: sdk.Variant
) -> None:
    server = fake(steps=4)
    run = sdk.run(server.base_url, TASK, variant=variant, headers={RUN_HEADER: variant})
    trace = server.summary()
    assert run.final == f"{DONE_PREFIX} completed 4 steps", trace
    assert run.tool_steps == [1, 2, 3, 4]
    assert run.stop_reasons == ["tool_use"] * 4 + ["end_turn"]
    assert run.stream_problems == []
    assert [s.kind for s in server.requests] == ["step"] * 4 + ["final"], trace
    assert server.conversation().key == f"run:{variant}"
    assert {s.stream for s in server.requests} == {variant in ("stream", "helper", "async-helper")}
    assert server.problems == server.thinking_problems == server.leaks == server.merged == []
    # Each answer's thinking block came back (with its signature) and was checked byte for byte.
    assert server.thinking_echoed == 4
    assert all(re.fullmatch(r"req_011C[1-9A-HJ-NP-Za-km-z]{20}", rid) for rid in run.request_ids)
    # The prompt is input + cache read + cache creation, in the fake's own count.
    for seen, usage in zip(server.requests, run.usages, strict=True):
        prompt = (
            usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]
        )
        assert prompt == seen.tokens == server.count(seen.body)
        assert seen.cache_breakpoints == [
            "system[0]",
            f"messages[{len(seen.body['messages']) - 1}].content[0]",
        ]
    # The first prompt is below the shortest cacheable prefix; from the third request on, the
    # moving breakpoint reads exactly what the request before it cached.
    reads = [s.cache_read for s in server.requests]
    assert reads[:2] == [0, 0] and all(reads[2:]), trace
    for before, after in zip(server.requests[1:], server.requests[2:], strict=False):
        assert after.cache_read == before.cache_read + before.cache_creation


def test_count_tokens_is_the_prompt_count_of_every_answer(fake: Callable[..., AnthropicUpstream]) -> None:
    server = fake()
    client = _client(server)
    body = _body([{"role": "user", "content": step_output(1)}])
    del body["max_tokens"], body["thinking"]
    counted = client.messages.count_tokens(**body).input_tokens
    assert counted == server.count(body) == count_tokens(body)
    assert server.count_requests == [(orjson.loads(orjson.dumps(body)), counted)]
    usage = client.messages.create(max_tokens=64, **body).usage
    assert (
        usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
        == counted
    )
    # Not an OpenAI count: o200k times 1.2, plus the tool-use system prompt when there are tools.
    o200k = server.tokenizer.counter.count_text(step_output(1))
    assert counted >= 1.2 * o200k
    without_tools = client.messages.count_tokens(model=sdk.MODEL, messages=body["messages"]).input_tokens
    assert counted - without_tools > TOOLS_PROMPT_TOKENS
    assert ClaudeTokenizer(factor=1.0).count(body) < counted
    # Claude Code's own prompt (system, 24 tools) is most of its first request.
    captured = orjson.loads((FIXTURES / "claude-code-turn1.json").read_bytes())
    assert 20_000 < count_tokens(captured) < 40_000


# ----- the window ------------------------------------------------------------------------------


def test_a_long_run_at_a_small_window_fails_with_the_context_error(
    fake: Callable[..., AnthropicUpstream],
) -> None:
    server = fake(window=12_000, steps=10)
    with pytest.raises(anthropic.BadRequestError) as caught:
        sdk.run(server.base_url, TASK, max_tokens=2048)
    error = caught.value
    assert error.status_code == 400
    body = _error(error)
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert CONTEXT_ERROR.fullmatch(body["error"]["message"]), body
    assert error.request_id == error.response.headers["request-id"] == body["request_id"]
    [rejected] = server.rejected
    assert rejected.budget > 12_000 and rejected.step == 4, server.summary()  # 4 steps fitted
    assert all(s.budget <= 12_000 for s in server.requests if s.kind != "rejected")


def test_the_context_errors_are_worded_as_the_real_api_words_them(
    fake: Callable[..., AnthropicUpstream],
) -> None:
    server = fake()
    body = _body([{"role": "user", "content": step_output(1)}], max_tokens=2048)
    tokens = server.count(body)
    server.window = tokens + 1000  # the prompt fits, the prompt plus max_tokens does not
    response = _post(server, body)
    assert response.status_code == 400
    assert response.json()["error"] == {
        "type": "invalid_request_error",
        "message": f"input length and `max_tokens` exceed context limit: {tokens} + 2048 > {tokens + 1000}, "
        "decrease input length or `max_tokens` and try again",
    }
    server.window = tokens - 1  # the prompt alone is over
    response = _post(server, body)
    assert (
        response.json()["error"]["message"] == f"prompt is too long: {tokens} tokens > {tokens - 1} maximum"
    )
    assert response.headers["request-id"] == response.json()["request_id"]
    assert [s.kind for s in server.requests] == ["rejected", "rejected"]
    server.window = tokens + 2048
    assert _post(server, body).status_code == 200


# ----- failures --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "error_class", "error_type"),
    [
        (400, anthropic.BadRequestError, "invalid_request_error"),
        (401, anthropic.AuthenticationError, "authentication_error"),
        (429, anthropic.RateLimitError, "rate_limit_error"),
        (500, anthropic.InternalServerError, "api_error"),
        (529, anthropic.OverloadedError, "overloaded_error"),
    ],
)
def test_http_errors_surface_as_the_sdk_exceptions(
    fake: Callable[..., AnthropicUpstream], status: int, error_class: type[Exception], error_type: str
) -> None:
    server = fake(fail_request=1, failure=Failure(status=status))
    client = _client(server)
    with pytest.raises(error_class) as caught:
        client.messages.create(**_body())
    error = caught.value
    assert isinstance(error, anthropic.APIStatusError)
    assert error.status_code == status and _error(error)["error"]["type"] == error_type
    assert error.request_id == error.response.headers["request-id"]
    if status == 429:
        assert error.response.headers["retry-after"] == "0"
        assert error.response.headers["anthropic-ratelimit-requests-remaining"] == "0"
    # A failed request does not advance the run: the next one gets step 1.
    answer = client.messages.create(**_body())
    assert [b.type for b in answer.content] == ["thinking", "text", "tool_use"]
    assert [(s.kind, s.step) for s in server.requests] == [("failed", 0), ("step", 1)]


def test_a_wrong_api_key_gets_the_real_401(fake: Callable[..., AnthropicUpstream]) -> None:
    server = fake(api_key="sk-ant-the-right-one")
    with pytest.raises(anthropic.AuthenticationError, match="invalid x-api-key"):
        _client(server).messages.create(**_body())
    assert [(s.kind, s.status) for s in server.requests] == [("unauthorized", 401)]


@pytest.mark.parametrize(("status", "retry_after", "at_least"), [(429, "1", 0.95), (529, None, 0.3)])
def test_the_sdk_retries_and_honours_retry_after(
    fake: Callable[..., AnthropicUpstream], status: int, retry_after: str | None, at_least: float
) -> None:
    server = fake(steps=2, fail_request=2, failure=Failure(status=status, retry_after=retry_after))
    run = sdk.run(server.base_url, TASK, variant="helper", max_retries=2)
    assert run.final == f"{DONE_PREFIX} completed 2 steps", server.summary()
    failed, retried = server.requests[1], server.requests[2]
    assert (failed.kind, retried.kind, retried.step) == ("failed", "step", 2)
    assert retried.at - failed.at >= at_least
    assert retried.headers["x-stainless-retry-count"] == "1"


@pytest.mark.parametrize("variant", ["create", "stream", "helper", "async-helper"])
def test_a_mid_stream_error_event_raises_in_the_sdk(
    fake: Callable[..., AnthropicUpstream], variant: sdk.Variant
) -> None:
    server = fake(steps=3, fail_request=2, failure=Failure("stream_error", after_events=6))
    run = sdk.run(server.base_url, TASK, variant=variant, raise_errors=False)
    assert run.tool_steps == [1] and run.final == ""
    assert isinstance(run.error, anthropic.APIStatusError)
    assert _error(run.error)["error"] == {"type": "overloaded_error", "message": "Overloaded"}
    if variant == "create":  # no stream to break: the same failure is an HTTP 529
        assert isinstance(run.error, anthropic.OverloadedError)
    else:  # the SDK raises on the event itself, in a response that began 200
        assert run.error.status_code == 200
    assert server.requests[1].kind == "failed"


@pytest.mark.parametrize("variant", ["create", "stream", "helper"])
def test_a_connection_reset_raises_in_the_sdk(
    fake: Callable[..., AnthropicUpstream], variant: sdk.Variant
) -> None:
    server = fake(steps=3, fail_request=2, failure=Failure("reset", after_events=6))
    run = sdk.run(server.base_url, TASK, variant=variant, raise_errors=False)
    assert run.tool_steps == [1] and run.final == ""
    if variant == "create":
        assert isinstance(run.error, anthropic.APIConnectionError)
    else:  # the SDK does not wrap a stream cut mid-body
        assert type(run.error).__name__ == "RemoteProtocolError"
