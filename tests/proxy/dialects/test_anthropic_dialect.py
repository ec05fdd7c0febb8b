"""The Anthropic Messages adapter: real Claude Code bodies read and written back byte for byte,
changed messages keep every field but their new text, the summary carries a cache breakpoint
(at most four), and every view of every shipped policy keeps the Messages protocol, over every
sample trajectory request by request and over generated conversations."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings

from policies.conversation import role
from policies.pipeline import build_policies
from policies.tokens import TokenCounter
from proxy.config.settings import Settings, policy_specs
from proxy.dialects.anthropic import AnthropicDialect, breakpoints
from proxy.dialects.anthropic_messages import OPENING
from replay.recording.rows import iter_rows, row_messages, row_tools
from replay.session.doors import request
from tests.anthropic_protocol import problems, signatures
from tests.policies.conversations import conversation

ROOT = Path(__file__).resolve().parents[3]
CLIENTS = ROOT / "tests" / "fixtures" / "clients"
SAMPLE = ROOT / "tests" / "fixtures" / "sample_trajectories.jsonl"  # the 68 sample rows
DATA = SAMPLE if SAMPLE.exists() else ROOT / "tests" / "fixtures" / "trajectories_sample.jsonl"
COUNTER = TokenCounter()
POLICIES = build_policies(policy_specs(Settings()))
DIALECT = AnthropicDialect()
CLAUDE_CODE = sorted(p.name for p in CLIENTS.glob("claude-code-*.json") if "headers" not in p.name)


def fixture(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((CLIENTS / name).read_text())
    return body


def through(
    body: dict[str, Any], policy: str, window: int, checkpoint: Any = None
) -> tuple[dict[str, Any], Any]:
    """The wire body the proxy sends for ``body`` under ``policy``, and the outcome."""
    parsed = DIALECT.parse(body)
    outcome = asyncio.run(
        POLICIES[policy].apply(parsed.neutral, COUNTER, window=window, checkpoint=checkpoint)
    )
    if outcome.messages is None:
        return body, outcome
    return DIALECT.render(parsed, outcome.messages, outcome.origin or ()), outcome


@pytest.mark.parametrize("name", CLAUDE_CODE)
def test_claude_code_bodies_go_back_byte_for_byte(name: str) -> None:
    body = fixture(name)
    parsed = DIALECT.parse(body)
    assert parsed.skipped is None
    messages = parsed.neutral["messages"]
    rendered = DIALECT.render(parsed, messages, range(len(messages)))
    assert orjson.dumps(rendered) == orjson.dumps(body)
    # Every untouched wire message is the client's own object.
    assert all(a is b for a, b in zip(rendered["messages"], body["messages"], strict=True))


def test_claude_code_history_reads_into_the_neutral_conversation() -> None:
    body = fixture("claude-code-turn3.json")
    messages = DIALECT.parse(body).neutral["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assistant = messages[2]
    assert assistant["tool_calls"][0]["function"]["name"] == "Bash"
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"])["command"] == "ls -la"
    assert assistant["wire_only"] == "Fake thinking for turn 1."  # counted, never summarized
    assert messages[3]["name"] == "Bash" and messages[3]["tool_call_id"] == assistant["tool_calls"][0]["id"]
    # Thinking text is counted with its message.
    without = {k: v for k, v in assistant.items() if k != "wire_only"}
    assert COUNTER.count_message(assistant, "o200k_base") > COUNTER.count_message(without, "o200k_base")


def test_a_changed_result_keeps_its_ids_cache_control_and_error_flag() -> None:
    body = fixture("claude-code-turn3.json")
    parsed = DIALECT.parse(body)
    view = list(parsed.neutral["messages"])
    view[5] = {**view[5], "content": "[output saved: handle=out_0123456789abcdef]"}
    rendered = DIALECT.render(parsed, view, range(len(view)))
    assert problems(rendered) == []
    changed = rendered["messages"][-1]["content"][0]
    original = body["messages"][-1]["content"][0]
    assert changed["content"] == "[output saved: handle=out_0123456789abcdef]"
    assert {k: v for k, v in changed.items() if k != "content"} == {
        k: v for k, v in original.items() if k != "content"
    }
    assert changed["cache_control"] == {"type": "ephemeral"}
    assert rendered["messages"][:-1] == body["messages"][:-1]
    assert signatures(rendered) == signatures(body)


def test_a_changed_assistant_keeps_thinking_and_tool_use_ids() -> None:
    body = fixture("claude-code-turn3.json")
    parsed = DIALECT.parse(body)
    view = list(parsed.neutral["messages"])
    view[2] = {**view[2], "content": "Listing."}
    rendered = DIALECT.render(parsed, view, range(len(view)))
    blocks = rendered["messages"][1]["content"]
    assert [b["type"] for b in blocks] == ["thinking", "text", "tool_use"]
    assert blocks[0] is body["messages"][1]["content"][0]
    assert blocks[1]["text"] == "Listing." and blocks[2] is body["messages"][1]["content"][2]


def summarized(body: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``body`` rendered with its middle replaced by a summary (system, task, summary, the last
    two steps)."""
    parsed = DIALECT.parse(body)
    messages = parsed.neutral["messages"]
    summary = {"role": "user", "content": "Summary of the work so far: listed files."}
    view = [messages[0], messages[1], summary, *messages[-4:]]
    origin = [0, 1, -1, *range(len(messages) - 4, len(messages))]
    return parsed, DIALECT.render(parsed, view, origin)


def test_the_summary_is_cached() -> None:
    body = fixture("claude-code-turn4.json")  # Claude Code's three breakpoints
    parsed, rendered = summarized(body)
    assert problems(rendered) == [], problems(rendered)
    assert breakpoints(rendered) == 4
    # The first user message and the summary (both the user's) are one wire message; the
    # summary's block carries the breakpoint.
    first = rendered["messages"][0]["content"]
    assert first[-1] == {
        "type": "text",
        "text": "Summary of the work so far: listed files.",
        "cache_control": {"type": "ephemeral"},
    }
    assert parsed.notes["cache_breakpoint"] == "summary"
    assert signatures(rendered).items() <= signatures(body).items()


def test_the_clients_breakpoints_are_never_removed_for_the_proxys() -> None:
    body = fixture("claude-code-turn4.json")
    body["messages"][-3]["content"][-1]["cache_control"] = {"type": "ephemeral"}  # a fourth, kept
    parsed, rendered = summarized(body)
    assert breakpoints(rendered) == 4 and problems(rendered) == []
    assert parsed.notes["cache_breakpoint"] == "the client's breakpoints use every slot"
    # Automatic caching (a top-level cache_control) takes a slot too.
    body = {**fixture("claude-code-turn4.json"), "cache_control": {"type": "ephemeral"}}
    parsed, rendered = summarized(body)
    assert breakpoints(rendered) == 4 and parsed.notes["cache_breakpoint"].startswith("the client's")


def test_the_proxys_breakpoint_takes_the_ttl_of_the_ones_after_it() -> None:
    """A 1-hour breakpoint may not come after a 5-minute one (the API refuses it)."""
    body = fixture("claude-code-turn4.json")
    body["messages"][-1]["content"][-1]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    body["system"][1]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    body["system"][2]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    _, rendered = summarized(body)
    assert rendered["messages"][0]["content"][-1]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}


def test_a_view_opening_with_the_assistant_gets_a_user_opening() -> None:
    body = fixture("claude-code-turn3.json")
    parsed = DIALECT.parse(body)
    messages = parsed.neutral["messages"]
    rendered = DIALECT.render(parsed, [messages[0], *messages[4:]], [0, 4, 5])
    assert rendered["messages"][0] == {"role": "user", "content": [{"type": "text", "text": OPENING}]}
    assert problems(rendered) == []


def test_a_new_system_note_joins_the_system_blocks() -> None:
    body = fixture("claude-code-turn3.json")
    parsed = DIALECT.parse(body)
    messages = parsed.neutral["messages"]
    note = {"role": "system", "content": "Read saved outputs before quoting them."}
    rendered = DIALECT.render(parsed, [messages[0], note, *messages[1:]], [0, -1, *range(1, len(messages))])
    assert rendered["system"][:-1] == body["system"]
    assert rendered["system"][-1] == {"type": "text", "text": note["content"]}
    assert rendered["messages"] == body["messages"]


def test_malformed_histories_go_as_sent() -> None:
    assert DIALECT.parse({"model": "m", "messages": [{"role": "tool", "content": "x"}]}).skipped
    assert DIALECT.parse({"model": "m", "messages": [{"role": "user", "content": [1]}]}).skipped
    assert DIALECT.parse({"model": "m", "messages": [{"role": "user", "content": 7}]}).skipped


def unmarked(value: Any) -> Any:
    """``value`` without any ``cache_control`` breakpoint."""
    if isinstance(value, dict):
        return {k: unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [unmarked(v) for v in value]
    return value


def requests_of(messages: list[Any]) -> list[list[Any]]:
    return [messages[:i] for i, m in enumerate(messages) if role(m) == "assistant" and i > 0]


@pytest.mark.parametrize("policy", ["improved", "n_latest_10", "sre", "improved_retry"])
def test_every_view_of_every_sample_trajectory_keeps_the_protocol(policy: str) -> None:
    views = rewritten = 0
    for row in list(iter_rows(DATA)):
        messages, tools = row_messages(row), row_tools(row)
        checkpoint = None
        previous: list[Any] | None = None
        for history in requests_of(messages):
            body = request("anthropic", "claude-sonnet-4-5", history, tools)
            sent, outcome = through(body, policy, 8_192, checkpoint)
            checkpoint = outcome.checkpoint
            # A body the policy left alone goes as the client sent it (two of the sample runs
            # have consecutive user messages, which the API merges); a view the proxy wrote
            # keeps every rule.
            found = problems(sent) if sent is not body else []
            assert found == [], (row["instance_id"], len(history), found)
            if previous is not None and outcome.trigger is None and policy.startswith("improved"):
                # Between compaction points the sent prefix only grows (the cache keeps hitting),
                # but for the previous view's final step in a tight session (an output put
                # behind its handle in place): everything before its call stays.
                final = max(
                    (i for i, m in enumerate(previous) if m["role"] == "assistant"), default=len(previous)
                )
                # The proxy's breakpoint moves to the newest block it wrote (``cache_control``
                # is no part of the cached content: the API matches the prefix without it).
                assert unmarked(sent["messages"][:final]) == unmarked(previous[:final]), (
                    row["instance_id"],
                    len(history),
                )
            previous = sent["messages"]
            views += 1
            rewritten += sent is not body
    assert views > 500 and rewritten > 100


@pytest.mark.parametrize("policy", sorted(POLICIES))
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(messages=conversation())
def test_generated_conversations_keep_the_protocol(policy: str, messages: list[Any]) -> None:
    if messages[-1].get("role") == "assistant":
        messages = messages[:-1]  # a trailing call without results is not a Messages request
    body = request("anthropic", "claude-sonnet-4-5", messages, [])
    original = copy.deepcopy(body)
    for window in (2_048, 6_000):
        sent, _ = through(body, policy, window)
        if sent is not body:  # (a body left alone goes as sent, consecutive user turns and all)
            assert problems(sent) == [], problems(sent)
    assert body == original  # the client's body is never changed in place


def test_the_prompt_tokens_a_relayed_answer_reports() -> None:
    usage = {"input_tokens": 10, "cache_creation_input_tokens": 200, "cache_read_input_tokens": 3000}
    start = {"type": "message_start", "message": {"id": "msg_1", "usage": {**usage, "output_tokens": 1}}}
    head = b"event: message_start\ndata: " + orjson.dumps(start) + b"\n\nevent: ping\ndata: {}\n\n"
    assert DIALECT.reported_prompt_tokens(head, sse=True) == 3210
    assert DIALECT.reported_prompt_tokens(b"event: ping\ndata: {}\n\n", sse=True) == 0
    message = {"type": "message", "content": [], "usage": usage}
    assert DIALECT.reported_prompt_tokens(orjson.dumps(message), sse=False) == 3210
    assert DIALECT.reported_prompt_tokens(b"{truncated", sse=False) == 0


def test_images_and_documents_are_counted_as_claude_counts_them() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR" * 10}}
    text_document = {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": "word " * 5000},
    }
    pdf = {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": "A" * 400_000},
    }
    user = {"role": "user", "content": [{"type": "text", "text": "look"}, image, text_document, pdf]}
    shot = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [image]}
    call = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "Screenshot", "input": {}}],
    }
    body = {"model": "claude-sonnet-4-6", "messages": [user, call, {"role": "user", "content": [shot]}]}
    parsed = DIALECT.parse(body)
    first, _, result = parsed.neutral["messages"]
    # The text document is read as its text; the image and the PDF (300 KB: about 11.7k tokens)
    # are estimates, which keep the request out of the factor's calibration.
    assert COUNTER.count_message(first, "o200k_base") > 5000 + 1600 + 11_000
    assert first["wire_tokens"] == 1600 + 2000 * 300_000 // 51_200
    assert result["wire_tokens"] == 1600 and result["content"] == "[image]"
    assert parsed.notes["media"] == 2
