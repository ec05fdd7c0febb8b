"""The fake Anthropic Messages API (``tests.anthropic_upstream``) driven DIRECTLY, without the proxy:
proof that it checks the protocol as the real server does, and that its scripted agent answers as
the through-the-proxy tests expect.

Protocol violations (a ``tool_use`` without its result, ids unanswered, duplicated or unknown,
the assistant first, no thinking block in a tool turn, empty text), altered thinking blocks (a
signature, a thinking text, redacted data changed, or a block sent back in another message than
its own) and more than four cache breakpoints are sent by hand and must be recorded, and refused
with the real 400 when strict; consecutive messages of one role are merged, not refused, and the
thinking budget follows the real rules. Claude Code's captured bodies pass the structure checks.
The scripted agent fills Claude Code's tools, asks ``read_tool_output`` reads, answers their
follow-up rounds, spots a round leaked into a client's request, summarizes when it has no tool or
is asked to compact, and the fake answers on the real server's routes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import orjson
import pytest

from tests.anthropic_upstream import (
    READ_TOOL,
    SUMMARY_PREFIX,
    AnthropicUpstream,
    protocol_problems,
    shell_command,
    step_output,
    thinking_problems,
)
from tests.anthropic_upstream.tokens import ClaudeTokenizer, breakpoints
from tests.e2e.clients import anthropic_sdk_loop as sdk
from tests.e2e.clients.anthropic_fake_helpers import (
    FIXTURES,
    TASK,
    _body,
    _client,
    _error,
    _post,
    _result,
    _text,
    _use,
    started_fakes,
)

pytestmark = pytest.mark.e2e

HANDLE = "out_0123456789abcdef"


@pytest.fixture
def fake() -> Iterator[Callable[..., AnthropicUpstream]]:
    yield from started_fakes()


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
    # The round put back where it happened, in a later request, is the model's own: no leak.
    restored = [
        *history,
        *round_,
        {"role": "assistant", "content": follow_up["content"]},
        {"role": "user", "content": [_result(follow_up["content"][-1]["id"], step_output(2))]},
    ]
    _post(server, _body(restored, tools=tools))
    assert server.requests[-1].leaks == []
    # A read call the model never made, or a read result without its call, came from elsewhere.
    invented = {"type": "tool_use", "id": "toolu_invented", "name": READ_TOOL, "input": {"handle": HANDLE}}
    leaked = [
        *history,
        {"role": "assistant", "content": [invented]},
        {"role": "user", "content": [_result("toolu_invented", "saved output")]},
        {"role": "assistant", "content": [_text("ok")]},
        {"role": "user", "content": [round_[1]["content"][0], _text("go on")]},
        {"role": "assistant", "content": [_text("fine")]},
        {"role": "user", "content": [_text("continue")]},
    ]
    _post(server, _body(leaked, tools=tools))
    assert server.requests[-1].leaks == [
        "messages.3.content.0: a read_tool_output tool_use the model never made",
        "messages.6.content.0: a read_tool_output tool_result without its call",
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
