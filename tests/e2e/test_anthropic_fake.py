"""The fake Anthropic Messages API (``tests.anthropic_upstream``) driven DIRECTLY, without the proxy,
by the official ``anthropic`` SDK and by Claude Code: proof that it behaves like the real server,
so that the through-the-proxy tests can trust what it accepts and refuses.

The SDK runs the agent loop of ``tests/e2e/clients/anthropic_sdk_loop.py`` in each of its ways
(create, async, raw stream, the stream helper) and sees the real wire format, the real error
classes (``BadRequestError`` with the real context message, ``AuthenticationError``,
``RateLimitError`` honouring ``retry-after``, ``InternalServerError``, ``OverloadedError``, a
mid-stream ``error`` event, a reset), prompt caching and ``count_tokens``. Protocol violations,
altered thinking blocks and too many cache breakpoints are sent by hand and must be recorded
(and refused with the real 400 when strict). Claude Code (``claude -p``, from npm, skipped without
npm) completes a run against the fake, fails at a small window with its context error, and
recovers from the failures it retries.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import orjson
import pytest

from tests.anthropic_upstream import (
    DONE_PREFIX,
    READ_TOOL,
    RUN_HEADER,
    SUMMARY_PREFIX,
    AnthropicUpstream,
    Failure,
    count_tokens,
    protocol_problems,
    shell_command,
    step_output,
    thinking_problems,
)
from tests.anthropic_upstream.tokens import TOOLS_PROMPT_TOKENS, ClaudeTokenizer, breakpoints
from tests.e2e.clients import anthropic_sdk_loop as sdk
from tests.e2e.clients.claude_code import ClaudeRun, claude_binary, claude_run

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "clients"
TASK = "Run the scripted checks one by one with run_check, then report."
CLAUDE_TASK = "Run the scripted checks one by one with Bash, then report."
CONTEXT_ERROR = re.compile(
    r"prompt is too long: \d+ tokens > \d+ maximum"
    r"|input length and `max_tokens` exceed context limit: \d+ \+ \d+ > \d+, "
    r"decrease input length or `max_tokens` and try again"
)
HANDLE = "out_0123456789abcdef"


@pytest.fixture
def fake() -> Iterator[Callable[..., AnthropicUpstream]]:
    started: list[AnthropicUpstream] = []

    def start(**options: Any) -> AnthropicUpstream:
        server = AnthropicUpstream(**options).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _client(server: AnthropicUpstream, **options: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.base_url, api_key=sdk.API_KEY, max_retries=options.pop("max_retries", 0), **options
    )


def _body(messages: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    """A request of the SDK loop's shape (its tool, thinking on) with ``messages``."""
    return {
        "model": sdk.MODEL,
        "max_tokens": 4096,
        "system": sdk.SYSTEM,
        "tools": [sdk.tool_schema()],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": messages or [{"role": "user", "content": TASK}],
        **extra,
    }


def _post(server: AnthropicUpstream, body: dict[str, Any], path: str = "/v1/messages") -> httpx.Response:
    headers = {"x-api-key": sdk.API_KEY, "anthropic-version": "2023-06-01"}
    return httpx.post(server.base_url + path, json=body, headers=headers, timeout=10)


def _use(use_id: str, step: int = 1) -> dict[str, Any]:
    return {"type": "tool_use", "id": use_id, "name": sdk.TOOL_NAME, "input": {"step": step}}


def _result(use_id: str, text: str = "ok") -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": use_id, "content": text}


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _error(error: BaseException | None) -> dict[str, Any]:
    """The error body an SDK exception carries (``{"type": "error", "error": {...}, ...}``)."""
    assert isinstance(error, anthropic.APIStatusError), error
    body = error.body
    assert isinstance(body, dict), body
    return body


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


# ----- the protocol ----------------------------------------------------------------------------

USER: dict[str, Any] = {"role": "user", "content": [_text(TASK)]}
THINKING = {"type": "thinking", "thinking": "hm", "signature": "Er" + "A" * 40}
VIOLATIONS: list[tuple[str, list[dict[str, Any]], str]] = [
    (
        "tool_use-without-result",
        [
            USER,
            {"role": "assistant", "content": [_use("toolu_01a")]},
            {"role": "user", "content": [_text("go")]},
        ],
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_01a. "
        "Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
    ),
    (
        "text-before-tool_result",
        [
            USER,
            {"role": "assistant", "content": [_use("toolu_01a")]},
            {"role": "user", "content": [_text("here"), _result("toolu_01a")]},
        ],
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_01a.",
    ),
    (
        "tool_result-without-use",
        [
            USER,
            {"role": "assistant", "content": [_text("hi")]},
            {"role": "user", "content": [_result("toolu_01z")]},
        ],
        "messages.2.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_01z. "
        "Each `tool_result` block must have a corresponding `tool_use` block in the previous message.",
    ),
    (
        "duplicate-ids",
        [
            USER,
            {"role": "assistant", "content": [_use("toolu_01a")]},
            {"role": "user", "content": [_result("toolu_01a")]},
            {"role": "assistant", "content": [_use("toolu_01a")]},
            {"role": "user", "content": [_result("toolu_01a")]},
        ],
        "messages.3.content.0: `tool_use` ids must be unique",
    ),
    (
        "assistant-first",
        [{"role": "assistant", "content": "hi"}, USER],
        'messages: first message must use the "user" role',
    ),
    (
        "no-thinking-in-the-tool-turn",
        [
            USER,
            {"role": "assistant", "content": [_text("x"), _use("toolu_01a")]},
            {"role": "user", "content": [_result("toolu_01a")]},
        ],
        "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found `text`. "
        "When `thinking` is enabled, a final `assistant` message must start with a thinking block",
    ),
    (
        "empty-text",
        [{"role": "user", "content": [_text("")]}],
        "messages.0.content.0: text content blocks must be non-empty",
    ),
]


@pytest.mark.parametrize(("messages", "message"), [pytest.param(m, e, id=i) for i, m, e in VIOLATIONS])
def test_protocol_violations_are_recorded_and_refused_when_strict(
    fake: Callable[..., AnthropicUpstream], messages: list[dict[str, Any]], message: str
) -> None:
    lenient, strict = fake(), fake(strict=True)
    assert _post(lenient, _body(messages)).status_code == 200
    [seen] = lenient.requests
    assert any(p.startswith(message) for p in seen.problems), seen.problems
    with pytest.raises(anthropic.BadRequestError) as caught:
        _client(strict).messages.create(**_body(messages))
    assert _error(caught.value)["error"]["message"].startswith(message)
    assert strict.requests[0].kind == "invalid"


def test_consecutive_messages_of_one_role_are_merged_not_refused(
    fake: Callable[..., AnthropicUpstream],
) -> None:
    server = fake(strict=True)
    messages = [USER, {"role": "user", "content": "and more"}]
    assert _post(server, _body(messages)).status_code == 200
    assert server.merged == [
        "request 0: messages.1: a second `user` message in a row (the API merges it into the previous one)"
    ]
    assert server.problems == []


def test_thinking_blocks_must_come_back_byte_for_byte(fake: Callable[..., AnthropicUpstream]) -> None:
    server = fake(strict=True, redacted_thinking=True)
    client = _client(server)
    first = client.messages.create(**_body())
    content = [b.to_dict() for b in first.content]
    assert [b["type"] for b in content] == ["redacted_thinking", "thinking", "text", "tool_use"]

    def history(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            USER,
            {"role": "assistant", "content": blocks},
            {"role": "user", "content": [_result(content[3]["id"], step_output(1))]},
        ]

    altered_signature = [
        content[0],
        {**content[1], "signature": content[1]["signature"][:-4] + "AAAA"},
        *content[2:],
    ]
    altered_text = [content[0], {**content[1], "thinking": content[1]["thinking"] + " "}, *content[2:]]
    altered_data = [{**content[0], "data": content[0]["data"][::-1]}, *content[1:]]
    other_message = [content[0], content[1], content[3]]  # the text block dropped
    cases = [
        (altered_signature, "messages.1.content.1: Invalid `signature` in `thinking` block"),
        (altered_text, "messages.1.content.1: Invalid `signature` in `thinking` block"),
        (altered_data, "messages.1.content.0: Invalid `data` in `redacted_thinking` block"),
        (other_message, "messages.1.content.0: Invalid `data` in `redacted_thinking` block"),
    ]
    for blocks, message in cases:
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(**_body(history(blocks)))
        assert _error(caught.value)["error"]["message"] == message
    assert [p.split(" [", 1)[1] for p in server.thinking_problems] == [
        "never emitted: " + repr(altered_signature[1]["signature"][:24]) + "...]",
        "its thinking text was altered]",
        "never emitted: " + repr(altered_data[0]["data"][:24]) + "...]",
        "its message is not the one it was emitted in: ['redacted_thinking', 'thinking', 'tool_use'] now, "
        "['redacted_thinking', 'thinking', 'text', 'tool_use'] emitted]",
    ]
    # Sent back verbatim (cache_control and all), it is accepted and the run goes on.
    verbatim = [*content[:3], {**content[3], "cache_control": {"type": "ephemeral"}}]
    answer = client.messages.create(**_body(history(verbatim)))
    assert server.requests[-1].kind == "step" and answer.content[-1].input == {"step": 2}


def test_more_than_four_cache_breakpoints_are_refused(fake: Callable[..., AnthropicUpstream]) -> None:
    server = fake()
    marked = [{**_text(f"part {n}"), "cache_control": {"type": "ephemeral"}} for n in range(4)]
    body = _body([{"role": "user", "content": marked}])
    body["system"] = [{**_text(sdk.SYSTEM), "cache_control": {"type": "ephemeral"}}]
    with pytest.raises(anthropic.BadRequestError) as caught:
        _client(server).messages.create(**body)
    assert (
        _error(caught.value)["error"]["message"]
        == "A maximum of 4 blocks with cache_control may be provided. Found 5."
    )
    body["system"] = sdk.SYSTEM
    assert _post(server, body).status_code == 200


def test_thinking_budget_rules(fake: Callable[..., AnthropicUpstream]) -> None:
    server = fake()
    small = _post(server, _body(thinking={"type": "enabled", "budget_tokens": 512}))
    assert small.json()["error"]["message"].startswith(
        "thinking.enabled.budget_tokens: Input should be greater"
    )
    over = _body(max_tokens=2000, thinking={"type": "enabled", "budget_tokens": 4000})
    assert (
        _post(server, over)
        .json()["error"]["message"]
        .startswith("`max_tokens` must be greater than `thinking.budget_tokens`")
    )
    # With interleaved thinking (Claude Code's beta) the budget may exceed max_tokens.
    response = httpx.post(
        server.base_url + "/v1/messages?beta=true",
        json=over,
        headers={"x-api-key": "k", "anthropic-beta": "interleaved-thinking-2025-05-14"},
    )
    assert response.status_code == 200


def test_claude_code_captured_bodies_pass_the_structure_checks() -> None:
    """Claude Code's real bodies (tests/fixtures/clients) are well-formed for the fake; only their
    thinking signatures, emitted by another server, are unknown to it."""
    tokenizer = ClaudeTokenizer()
    for turn in range(1, 5):
        body = orjson.loads((FIXTURES / f"claude-code-turn{turn}.json").read_bytes())
        assert protocol_problems(body["messages"], thinking=True) == ([], [])
        assert len(breakpoints(tokenizer.segments(body))) == 3
        unknown = thinking_problems(body["messages"], {})
        assert len(unknown) == turn - 1 and all("never emitted" in p for p in unknown)


# ----- the scripted agent: reads, follow-ups, leaks, summaries, routes -------------------------


def test_the_scripted_agent_fills_claude_codes_tools() -> None:
    tools = orjson.loads((FIXTURES / "claude-code-turn1.json").read_bytes())["tools"]
    bash = AnthropicUpstream(steps=3).agent
    assert bash.client_tool(tools)["name"] == "Bash"  # type: ignore[index]
    assert bash.arguments_for(next(t for t in tools if t["name"] == "Bash"), 2) == {
        "command": shell_command(2, 90),
        "description": "Run scripted check 2",
    }
    read = AnthropicUpstream(tool="Read", file_template="/work/check_{step}.log").agent
    read_tool = read.client_tool(tools)
    assert read_tool is not None and read.arguments_for(read_tool, 7) == {"file_path": "/work/check_7.log"}


def test_reads_follow_ups_leaks_and_summaries(fake: Callable[..., AnthropicUpstream]) -> None:
    read_tool = {"name": READ_TOOL, "description": "Read a saved output.", "input_schema": {"type": "object"}}
    tools = [sdk.tool_schema(), read_tool]
    server = fake(mixed="after", read_preamble="Let me look first. ", fail_read_follow_up=3)
    history: list[dict[str, Any]] = [
        {"role": "user", "content": [_text(f"{TASK} Earlier output saved as handle={HANDLE}.")]}
    ]
    step = _post(server, _body(history, tools=tools)).json()  # a step first: reads come after one
    history += [
        {"role": "assistant", "content": step["content"]},
        {"role": "user", "content": [_result(step["content"][-1]["id"], step_output(1))]},
    ]
    answer = _post(server, _body(history, tools=tools)).json()
    kinds = [(b["type"], b.get("name")) for b in answer["content"]]
    assert kinds == [("thinking", None), ("text", None), ("tool_use", READ_TOOL), ("tool_use", sdk.TOOL_NAME)]
    assert answer["content"][1]["text"] == "Let me look first. "
    read, mixed = answer["content"][2], answer["content"][3]
    assert read["input"] == {"handle": HANDLE, "pattern": "ERROR"} and server.mixed_calls == {mixed["id"]}
    # The proxy's round: the answer and the read's result (the mixed call answered too), asked again.
    round_ = [
        {"role": "assistant", "content": answer["content"]},
        {"role": "user", "content": [_result(read["id"], "7: ERROR ..."), _result(mixed["id"], "not run")]},
    ]
    follow_up = _post(server, _body(history + round_, tools=tools)).json()
    assert follow_up["content"][-1]["input"] == {"step": 2}
    seen = server.requests[-1]
    assert seen.read_follow_up and seen.leaks == seen.problems == seen.thinking_problems == []
    # A round that drops the mixed call sends the thinking block in another message than its own.
    dropped = [
        {"role": "assistant", "content": answer["content"][:3]},
        {"role": "user", "content": [round_[1]["content"][0]]},
    ]
    _post(server, _body(history + dropped, tools=tools))
    [moved] = server.requests[-1].thinking_problems
    assert moved.startswith(
        "messages.3.content.0: Invalid `signature` in `thinking` block [its message is not"
    )
    # The round in a request the client makes (its last message answers its own tool) is a leak.
    leaked = [
        *history,
        *round_,
        {"role": "assistant", "content": follow_up["content"]},
        {"role": "user", "content": [_result(follow_up["content"][-1]["id"], step_output(2))]},
    ]
    _post(server, _body(leaked, tools=tools))
    assert server.requests[-1].leaks == [
        "messages.3.content.2: a read_tool_output tool_use",
        "messages.4.content.0: a read_tool_output tool_result",
    ]
    # The third follow-up round fails as asked (HTTP 500), without advancing the run.
    before = server.conversation().step
    assert _post(server, _body(history + round_, tools=tools)).status_code == 500
    assert server.requests[-1].kind == "failed" and server.failures_injected == 1
    # No client tool, or Claude Code's compaction prompt: a summary, and the run does not move.
    summary = _post(server, _body(history, tools=[])).json()
    assert summary["content"][-1]["text"].startswith(SUMMARY_PREFIX) and summary["stop_reason"] == "end_turn"
    compact: list[dict[str, Any]] = [
        *history,
        {"role": "user", "content": "Your task is to create a detailed summary of the conversation."},
    ]
    assert _post(server, _body(compact)).json()["content"][-1]["text"].startswith(SUMMARY_PREFIX)
    assert server.conversation().step == before


def test_routes_like_the_real_server(fake: Callable[..., AnthropicUpstream]) -> None:
    server = fake()
    assert httpx.head(server.base_url + "/").status_code == 200
    assert httpx.get(server.base_url + "/").status_code == 200
    missing = httpx.get(server.base_url + "/v1/models")
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "not_found_error" and missing.headers["request-id"].startswith(
        "req_"
    )
    assert _post(server, _body(), path="/v1/messages?beta=true").status_code == 200
    assert server.requests[0].path == "/v1/messages?beta=true"
    assert [(m, p) for m, p, _ in server.others] == [("HEAD", "/"), ("GET", "/"), ("GET", "/v1/models")]
    bad = httpx.post(server.base_url + "/v1/messages", content=b"{not json", headers={"x-api-key": "k"})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"


# ----- Claude Code, directly against the fake --------------------------------------------------


@pytest.fixture(scope="session")
def claude() -> Path:
    binary = claude_binary()
    if binary is None:
        if os.environ.get("CPX_REQUIRE_CLIENTS") == "1":
            pytest.fail("npm is required here (CPX_REQUIRE_CLIENTS=1): the agent CLIs install from npm")
        pytest.skip(
            "npm is not installed: Claude Code (@anthropic-ai/claude-code from npm) cannot be installed"
        )
    return binary


def _claude_trace(server: AnthropicUpstream, run: ClaudeRun) -> str:
    head = f"exit {run.returncode} in {run.seconds:.1f} s: {run.final[:300]}"
    return f"{head}\n{run.stderr[-1500:]}\n{server.summary()}"


def test_claude_code_completes_a_multi_step_run(
    fake: Callable[..., AnthropicUpstream], claude: Path, tmp_path: Path
) -> None:
    server = fake(steps=4)
    run = claude_run(claude, server.base_url, CLAUDE_TASK, tmp_path, trace_network=True)
    trace = _claude_trace(server, run)
    assert run.returncode == 0 and run.final == f"{DONE_PREFIX} completed 4 steps", trace
    assert [s.kind for s in server.requests] == ["step"] * 4 + ["final"], trace
    assert server.problems == server.thinking_problems == server.leaks == server.merged == [], trace
    assert server.thinking_echoed == 4
    # Its Bash tool really ran each step's command: each output came back whole.
    last = server.requests[-1].body["messages"]
    results = [
        b["content"]
        for m in last
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]
    assert results == [step_output(n) for n in range(1, 5)]
    for seen in server.requests:
        assert seen.path == "/v1/messages?beta=true" and seen.stream and seen.thinking
        assert seen.headers["anthropic-version"] == "2023-06-01" and seen.headers["x-claude-code-session-id"]
        assert "Bash" in seen.tool_names and len(seen.tool_names) > 20
        assert seen.cache_breakpoints[-1].startswith(f"messages[{len(seen.body['messages']) - 1}]")
    assert server.conversation().key.startswith("session:")
    assert 25_000 < server.requests[0].tokens < 40_000  # its own system prompt and tools
    assert [(m, p) for m, p, _ in server.others] == [("HEAD", "/")] and server.count_requests == []
    assert run.connects == []  # nothing but the base URL (when strace is installed)


@pytest.mark.parametrize("own_compaction", [False, True], ids=["compaction-off", "own-compaction"])
def test_claude_code_at_a_small_window_fails_with_the_context_error(
    fake: Callable[..., AnthropicUpstream], claude: Path, tmp_path: Path, own_compaction: bool
) -> None:
    window = 40_000
    server = fake(window=window, steps=10)
    run = claude_run(claude, server.base_url, CLAUDE_TASK, tmp_path, own_compaction=own_compaction)
    trace = _claude_trace(server, run)
    assert run.returncode == 1 and run.is_error, trace
    assert server.rejected and all(CONTEXT_ERROR.fullmatch(s.error) for s in server.rejected), trace
    assert all(s.budget <= window for s in server.requests if s.kind != "rejected")
    # It retried its first refused request with max_tokens lowered to fit.
    assert server.requests[1].max_tokens < server.requests[0].max_tokens == 32_000, trace
    steps = max(s.step for s in server.requests)
    assert steps < 10
    if not own_compaction:
        assert run.final == "Prompt is too long" and run.result and run.result["api_error_status"] == 400, (
            trace
        )
    else:  # it summarized by itself (its compaction request, recognized), and still could not go on
        assert any(s.kind == "summary" for s in server.requests), trace


@pytest.mark.parametrize(
    ("failure", "failures"),
    [
        pytest.param(Failure(status=529), 2, id="529-twice"),
        pytest.param(Failure(status=429, retry_after="1"), 1, id="429-retry-after"),
        pytest.param(Failure("stream_error", after_events=5), 1, id="error-event"),
        pytest.param(Failure("reset", after_events=5), 1, id="reset"),
    ],
)
def test_claude_code_retries_what_the_real_api_asks_it_to(
    fake: Callable[..., AnthropicUpstream], claude: Path, tmp_path: Path, failure: Failure, failures: int
) -> None:
    server = fake(steps=2, fail_request=range(2, 2 + failures), failure=failure)
    run = claude_run(claude, server.base_url, CLAUDE_TASK, tmp_path)
    trace = _claude_trace(server, run)
    assert run.returncode == 0 and run.final == f"{DONE_PREFIX} completed 2 steps", trace
    kinds = [s.kind for s in server.requests]
    assert kinds == ["step", *["failed"] * failures, "step", "final"], trace
    retry = server.requests[1 + failures]
    if failure.status == 429:
        assert retry.at - server.requests[1].at >= 0.95
    # A stream cut mid-body is retried without streaming (Claude Code's fallback).
    assert retry.stream == (failure.kind != "reset")


def test_claude_code_reports_a_refused_key(
    fake: Callable[..., AnthropicUpstream], claude: Path, tmp_path: Path
) -> None:
    server = fake(api_key="sk-ant-another-key")
    run = claude_run(claude, server.base_url, CLAUDE_TASK, tmp_path, max_retries=1)
    trace = _claude_trace(server, run)
    assert run.returncode == 1 and run.final.startswith("Invalid API key"), trace
    assert run.result and run.result["api_error_status"] == 401
    # It retried the 401 once (CLAUDE_CODE_MAX_RETRIES=1), as it retries everything.
    assert [s.kind for s in server.requests] == ["unauthorized", "unauthorized"], trace
