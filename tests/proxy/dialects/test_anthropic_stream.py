"""The Messages stream codec, one round at a time, against a writer that records what the
client gets: block order kept when blocks are held, ``citations: null`` tolerated, thinking
before a read withheld, a silent round kept alive with pings; and ``add_round`` and the kept
read rounds (``HiddenRounds``)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from proxy.dialects.anthropic import AnthropicDialect
from proxy.dialects.anthropic_stream import AnthropicStream
from proxy.dialects.base import NOT_RUN, Answer
from proxy.dialects.hidden_rounds import HiddenRounds
from proxy.state.sqlite_store import SQLiteStore
from proxy.wire.response_writer import ResponseWriter

DIALECT = AnthropicDialect()


class Client:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def __call__(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    def events(self) -> list[dict[str, Any]]:
        body = b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")
        found = []
        for chunk in body.split(b"\n\n"):
            data = [line[5:].strip() for line in chunk.split(b"\n") if line.startswith(b"data:")]
            if data:
                found.append(orjson.loads(data[0]))
        return found


def event(payload: dict[str, Any]) -> bytes:
    return b"event: " + str(payload["type"]).encode() + b"\ndata: " + orjson.dumps(payload)


def round_of(blocks: list[dict[str, Any]]) -> list[bytes]:
    events = [event({"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 9}}})]
    for index, block in enumerate(blocks):
        events.append(event({"type": "content_block_start", "index": index, "content_block": block}))
        events.append(event({"type": "content_block_stop", "index": index}))
    delta = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}}
    return [*events, event(delta), event({"type": "message_stop"})]


async def play(blocks: list[dict[str, Any]]) -> tuple[AnthropicStream, Client]:
    client = Client()
    writer = ResponseWriter(client)
    writer.start(200, [], streaming=True)
    stream = DIALECT.codec(writer)
    for raw in round_of(blocks):
        await stream.take(raw)
    return stream, client


def test_blocks_reach_the_client_in_the_order_the_model_wrote_them() -> None:
    blocks = [
        {"type": "thinking", "thinking": "search first", "signature": "s1"},
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "x"}},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
        {"type": "text", "text": "Found it.", "citations": None},
    ]

    async def run() -> list[dict[str, Any]]:
        stream, client = await play(blocks)
        await stream.finish({"output_tokens": 2})
        return client.events()

    events = asyncio.run(run())
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "server_tool_use", "web_search_tool_result", "text"]
    assert [e["index"] for e in events if e["type"] == "content_block_start"] == [0, 1, 2, 3]
    assert events[-1]["type"] == "message_stop"


def test_a_citations_delta_after_citations_null() -> None:
    async def run() -> AnthropicStream:
        client = Client()
        writer = ResponseWriter(client)
        writer.start(200, [], streaming=True)
        stream = DIALECT.codec(writer)
        start = {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": "", "citations": None},
        }
        citation = {"type": "char_location", "cited_text": "x", "document_index": 0}
        delta = {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "citations_delta", "citation": citation},
        }
        for payload in (start, delta, {"type": "content_block_stop", "index": 0}):
            await stream.take(event(payload))
        return stream

    stream = asyncio.run(run())
    assert stream.items()[0]["citations"] == [
        {"type": "char_location", "cited_text": "x", "document_index": 0}
    ]


def test_thinking_before_a_read_never_reaches_the_client_and_pings_keep_it_alive() -> None:
    read = {"type": "tool_use", "id": "toolu_r", "name": "read_tool_output", "input": {"handle": "out_1"}}

    async def run() -> tuple[AnthropicStream, Client]:
        stream, client = await play([{"type": "thinking", "thinking": "read it", "signature": "s"}, read])
        assert client.events() == []  # nothing yet: a failure could still get a real status
        stream.relay.opened_at -= 60  # a long silence
        await stream.take(event({"type": "ping"}))
        return stream, client

    stream, client = asyncio.run(run())
    assert [e["type"] for e in client.events()] == ["message_start", "ping"]
    assert [b["type"] for b in stream.items()] == ["thinking", "tool_use"] and stream.calls() == [read]


def test_a_round_goes_back_whole_blank_text_dropped_planned_calls_not_run() -> None:
    read = {"type": "tool_use", "id": "toolu_r", "name": "read_tool_output", "input": {"handle": "out_1"}}
    planned = {"type": "tool_use", "id": "toolu_p", "name": "Bash", "input": {"command": "ls"}}
    thinking = {"type": "thinking", "thinking": "t", "signature": "s"}
    answer = Answer(calls=[read, planned], items=[thinking, {"type": "text", "text": "\n\n"}, read, planned])
    body = {"model": "claude-sonnet-4-6", "messages": [{"role": "user", "content": "go"}]}
    after = DIALECT.add_round(body, answer, [(read, "line 1")])
    assistant, results = after["messages"][-2:]
    assert assistant["content"] == [thinking, read, planned]
    assert results["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_p", "content": NOT_RUN, "is_error": True},
        {"type": "tool_result", "tool_use_id": "toolu_r", "content": "line 1"},
    ]


def test_kept_rounds_replace_the_answer_the_client_echoes(tmp_path: Any) -> None:
    read = {"type": "tool_use", "id": "toolu_r", "name": "read_tool_output", "input": {"handle": "out_1"}}
    rounds = [
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "t1", "signature": "s1"}, read]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_r", "content": "x"}]},
    ]
    answer = [
        {"type": "thinking", "thinking": "t2", "signature": "s2"},
        {"type": "tool_use", "id": "toolu_a", "name": "Bash", "input": {}},
    ]
    echoed = [{"type": "text", "text": "Let me look."}, answer[1]]  # what a streaming client kept
    later = {
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": echoed},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_a", "content": "ok"}]},
        ]
    }

    async def run() -> None:
        store = SQLiteStore(tmp_path / "store.db")
        here, there = HiddenRounds(store, shared=True), HiddenRounds(store, shared=True)
        await here.record("t_a", rounds, answer)
        restored, count = await here.restore("t_a", later)
        assert count == 1
        assert restored["messages"][1:4] == [*rounds, {"role": "assistant", "content": answer}]
        # Another process finds it in the store; another tenant never does.
        assert (await there.restore("t_a", later))[1] == 1
        assert (await there.restore("t_b", later))[1] == 0
        # Memory is bounded.
        small = HiddenRounds(store, shared=False, max_bytes=10)
        await small.record("t_a", rounds, answer)
        assert (await small.restore("t_a", later))[1] == 0
        await store.close()

    asyncio.run(run())


def test_a_read_rounds_short_text_never_reaches_the_client_and_long_text_streams() -> None:
    """Text before a read call: a short preamble is dropped with the thinking before it (as a
    non-streamed answer drops a read round's text); text longer than what is held streams as
    it arrives, the thinking before it first."""
    read = {"type": "tool_use", "id": "toolu_r", "name": "read_tool_output", "input": {"handle": "out_1"}}
    thinking = {"type": "thinking", "thinking": "read it", "signature": "s"}

    async def run(text: str) -> list[dict[str, Any]]:
        client = Client()
        writer = ResponseWriter(client)
        writer.start(200, [], streaming=True)
        stream = DIALECT.codec(writer)
        start = {"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 9}}}
        payloads: list[dict[str, Any]] = [
            start,
            {"type": "content_block_start", "index": 0, "content_block": thinking},
            {"type": "content_block_stop", "index": 0},
            {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
            *(
                {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": word}}
                for word in text.split(" ")
            ),
            {"type": "content_block_stop", "index": 1},
            {"type": "content_block_start", "index": 2, "content_block": read},
        ]
        for payload in payloads:
            await stream.take(event(payload))
        return client.events()

    assert asyncio.run(run("Let me look first.")) == []
    events = asyncio.run(run("Checking the saved output of every failing test first. " * 10))
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text"]
    assert "read_tool_output" not in orjson.dumps(events).decode()
