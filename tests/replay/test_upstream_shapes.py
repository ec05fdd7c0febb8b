"""What the recorded upstream logs per session for the cost simulation (``replay.session.upstream``)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson

from policies.tokens import REPLY_PRIMING, TokenCounter
from proxy.dialects.anthropic_from_chat import breakpoint_blocks as anthropic_breakpoints
from proxy.dialects.anthropic_messages import read_messages
from replay.session.cost import RequestShape
from replay.session.doors import PATHS, request
from replay.session.upstream import SESSION_HEADER, TICKET_HEADER, RecordedUpstream, Ticket

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a coding agent. " * 40},
    {"role": "user", "content": "Fix the bug in parser.py"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "Traceback: ValueError"},
]
REPLY = {"role": "assistant", "content": "done"}


async def _send(
    upstream: RecordedUpstream, dialect: str, body: dict[str, Any], ticket: Ticket, session: str
) -> Ticket:
    name = upstream.issue(ticket)
    async with httpx.AsyncClient(trust_env=False) as http:
        response = await http.post(
            upstream.base_url.removesuffix("/v1") + PATHS[dialect],
            content=orjson.dumps(body),
            headers={TICKET_HEADER: name, SESSION_HEADER: session},
        )
    assert response.status_code == 200
    return upstream.close_ticket(name)


def test_each_request_is_logged_with_its_kind_tokens_and_blocks() -> None:
    async def scenario() -> list[dict[str, Any]]:
        upstream = RecordedUpstream()
        await upstream.start()
        try:
            first = request("chat", "gpt-4o", HISTORY[:2], TOOLS)
            ticket = await _send(upstream, "chat", first, Ticket(reply=REPLY), "s1")
            assert ticket.received[0].tokens == TokenCounter().count_messages(HISTORY[:2], "o200k_base")
            await _send(
                upstream, "chat", request("chat", "gpt-4o", HISTORY, TOOLS), Ticket(reply=REPLY), "s1"
            )
            probe = request("chat", "gpt-4o", [*HISTORY, {"role": "user", "content": "Which file?"}], TOOLS)
            await _send(upstream, "chat", probe, Ticket(reply=REPLY, keep_messages=True), "s1")
            await _send(upstream, "chat", first, Ticket(reply=REPLY), "other")
            return upstream.take_session("s1")
        finally:
            await upstream.stop()

    logged = [RequestShape.from_json(r) for r in asyncio.run(scenario())]
    assert [s.kind for s in logged] == ["step", "step", "question"]
    counter = TokenCounter()
    first, second, _ = logged
    assert first.tokens == (
        counter.count_tools(TOOLS, "o200k_base"),
        *counter.count_messages(HISTORY[:2], "o200k_base"),
    )
    assert first.extra == REPLY_PRIMING
    assert second.ids[:3] == first.ids and len(set(second.ids)) == 5  # the tools block and 4 messages


def test_read_rounds_of_a_ticket_are_logged_as_such() -> None:
    from replay.session.upstream import request_kind

    step, answer = Ticket(reply=REPLY), Ticket(reply=None)
    assert request_kind(step) == "step" and request_kind(answer) == "answer"
    assert request_kind(Ticket(reply=REPLY, keep_messages=True)) == "question"
    step.received.append(None)  # type: ignore[arg-type]
    answer.received.append(None)  # type: ignore[arg-type]
    assert request_kind(step) == "step_read" and request_kind(answer) == "answer_read"


def test_anthropic_breakpoints_map_to_the_neutral_messages_that_carry_them() -> None:
    body = request("anthropic", "claude-sonnet-4", HISTORY, TOOLS)
    assert anthropic_breakpoints(body, read_messages(body).origins) == []
    body["system"] = [{"type": "text", "text": body["system"], "cache_control": {"type": "ephemeral"}}]
    body["tools"][0]["cache_control"] = {"type": "ephemeral"}
    # messages: user text, assistant tool_use, user tool_result (marked) -> neutral 1, 2, 3
    body["messages"][-1]["content"][0]["cache_control"] = {"type": "ephemeral"}
    read = read_messages(body)
    assert [m["role"] for m in read.messages] == ["system", "user", "assistant", "tool"]
    assert anthropic_breakpoints(body, read.origins) == [0, 1, 4]
    body["cache_control"] = {"type": "ephemeral"}  # automatic caching: the last block
    assert anthropic_breakpoints(body, read.origins)[-1] == 4


def test_anthropic_requests_are_logged_with_their_breakpoints() -> None:
    async def scenario() -> list[dict[str, Any]]:
        upstream = RecordedUpstream()
        await upstream.start()
        try:
            body = request("anthropic", "claude-sonnet-4", HISTORY, TOOLS)
            body["messages"][0]["content"] = [
                {"type": "text", "text": "Fix the bug", "cache_control": {"type": "ephemeral"}}
            ]
            await _send(upstream, "anthropic", body, Ticket(reply=REPLY), "a1")
            return upstream.take_session("a1")
        finally:
            await upstream.stop()

    (logged,) = [RequestShape.from_json(r) for r in asyncio.run(scenario())]
    assert logged.breakpoints == (2,) and len(logged.ids) == 5
