"""The replay's Gemini doors (``replay.session.doors``, ``replay.session.upstream``): requests go to
the path that names the model, the recorded upstream finds their door and model as the proxy
does and answers in Gemini's shape, the scripted reader's reads come back by their call ids, and
the proxy the replay starts sends Google's doors to the recorded upstream too."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import msgspec
import orjson

from proxy.config.settings import Settings
from replay.config import load_replay_config
from replay.session.cost import RequestShape
from replay.session.doors import DIALECTS, key_header, request, request_path
from replay.session.proxy_process import replay_proxy_config
from replay.session.reader import Reader
from replay.session.upstream import SESSION_HEADER, TICKET_HEADER, RecordedUpstream, Ticket

TOOLS = [{"type": "function", "function": {"name": "run_shell_command", "parameters": {"type": "object"}}}]
CALL = {"id": "c1", "type": "function", "function": {"name": "run_shell_command", "arguments": "{}"}}
HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix the bug in parser.py"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": "Traceback: ValueError"},
]
REPLY = {"role": "assistant", "content": "done"}
MODEL = "gemini-2.5-pro"


def test_the_gemini_doors_are_replayed_at_their_paths_with_their_clients_keys() -> None:
    assert {"gemini", "code_assist"} <= set(DIALECTS) and "gemini_count" not in DIALECTS
    assert request_path("gemini", MODEL) == f"/v1beta/models/{MODEL}:generateContent"
    # A model name is one path segment, as the proxy's door table reads it back.
    assert request_path("gemini", "a/b:c") == "/v1beta/models/a%2Fb%3Ac:generateContent"
    assert request_path("code_assist", MODEL) == "/v1internal:generateContent"
    assert request_path("chat", MODEL) == "/v1/chat/completions"
    assert key_header("gemini", "k") == {"x-goog-api-key": "k"}
    assert key_header("code_assist", "k") == key_header("chat", "k") == {"authorization": "Bearer k"}
    assert "model" not in request("gemini", MODEL, HISTORY, TOOLS)
    assert request("code_assist", MODEL, HISTORY, TOOLS)["model"] == MODEL


async def _post(upstream: RecordedUpstream, path: str, body: Any, ticket: str = "") -> httpx.Response:
    async with httpx.AsyncClient(trust_env=False) as http:
        return await http.post(
            upstream.root_url + path,
            content=orjson.dumps(body),
            headers={TICKET_HEADER: ticket, SESSION_HEADER: "g1"},
        )


def test_the_recorded_upstream_answers_gemini_requests_at_the_models_path() -> None:
    async def scenario() -> tuple[list[httpx.Response], list[Ticket], list[dict[str, Any]], int]:
        upstream = RecordedUpstream()
        await upstream.start()
        try:
            responses, tickets = [], []
            for dialect, model in (("gemini", MODEL), ("gemini", "gemini-2.5-flash"), ("code_assist", MODEL)):
                name = upstream.issue(Ticket(reply=REPLY))
                body = request(dialect, model, HISTORY, TOOLS)
                responses.append(await _post(upstream, request_path(dialect, model), body, name))
                tickets.append(upstream.close_ticket(name))
            # Streams and counts are no replayed door's: the replay reads answers whole.
            body = request("gemini", MODEL, HISTORY, TOOLS)
            for path in (":streamGenerateContent?alt=sse", ":countTokens"):
                response = await _post(upstream, f"/v1beta/models/{MODEL}{path}", body)
                assert response.status_code == 404
            return responses, tickets, upstream.take_session("g1"), upstream.unexpected
        finally:
            await upstream.stop()

    responses, tickets, logged, unexpected = asyncio.run(scenario())
    assert [r.status_code for r in responses] == [200, 200, 200] and unexpected == 2
    gemini, flash, code_assist = (r.json() for r in responses)
    assert gemini["candidates"][0]["content"] == {"role": "model", "parts": [{"text": "done"}]}
    assert (gemini["modelVersion"], flash["modelVersion"]) == (MODEL, "gemini-2.5-flash")
    assert code_assist["response"]["modelVersion"] == MODEL
    for ticket in tickets:
        (received,) = ticket.received
        assert received.problems == () and received.tool_names == ("run_shell_command",)
        assert received.message_count == len(HISTORY)
    # A prompt cache is per model: the path's model is in the tools block.
    shapes = [RequestShape.from_json(r) for r in logged]
    assert shapes[0].ids[1:] == shapes[1].ids[1:] and shapes[0].ids[0] != shapes[1].ids[0]


def test_the_scripted_reader_reads_through_a_gemini_door() -> None:
    """The reader's read calls go out as ``functionCall`` parts with their ids; the round the
    proxy sends back answers them with ``functionResponse`` parts of those ids, which the
    reader takes as its results."""
    question = [*HISTORY, {"role": "user", "content": "Which error?"}]

    async def scenario() -> tuple[dict[str, Any], Reader]:
        upstream = RecordedUpstream()
        await upstream.start()
        try:
            reader = Reader(("KeyError: 'x'",))
            name = upstream.issue(Ticket(reply=REPLY, keep_messages=True, reader=reader))
            body = request("gemini", MODEL, question, [*TOOLS, _read_tool()])
            body["contents"][-2]["parts"][0]["functionResponse"]["response"] = {
                "output": "[saved: handle=out_0123456789abcdef]"
            }
            first = (await _post(upstream, request_path("gemini", MODEL), body, name)).json()
            parts = first["candidates"][0]["content"]["parts"]
            answers = [
                {"functionResponse": {**_named(p), "response": {"output": "KeyError: 'x' at line 3"}}}
                for p in parts
            ]
            body["contents"] += [{"role": "model", "parts": parts}, {"role": "user", "parts": answers}]
            last = (await _post(upstream, request_path("gemini", MODEL), body, name)).json()
            upstream.close_ticket(name)
            return {"first": parts, "last": last}, reader
        finally:
            await upstream.stop()

    answered, reader = asyncio.run(scenario())
    calls = [p["functionCall"] for p in answered["first"]]
    assert [c["name"] for c in calls] == ["read_tool_output"] and calls[0]["id"] == "call_read_0"
    assert calls[0]["args"]["handle"] == "*"
    assert reader.found() == ["KeyError: 'x'"] and reader.figures()["read_calls"] == 1
    assert answered["last"]["candidates"][0]["content"]["parts"] == [{"text": "done"}]


def _read_tool() -> dict[str, Any]:
    return {"type": "function", "function": {"name": "read_tool_output", "parameters": {"type": "object"}}}


def _named(part: dict[str, Any]) -> dict[str, Any]:
    call = part["functionCall"]
    return {"id": call["id"], "name": call["name"]}


def test_the_replays_proxy_sends_googles_doors_to_the_recorded_upstream(tmp_path: Path) -> None:
    config = load_replay_config(None, {"dialect": "gemini"})
    data = replay_proxy_config(Settings(), config, "http://127.0.0.1:4321/v1", tmp_path)
    assert data["gemini"] == {
        "base_url": "http://127.0.0.1:4321",
        "api_key": None,
        "code_assist_url": "http://127.0.0.1:4321",
    }
    settings = msgspec.convert(data, Settings)  # Google's base URLs are roots, as validated
    assert settings.upstream.base_url == "http://127.0.0.1:4321/v1"
