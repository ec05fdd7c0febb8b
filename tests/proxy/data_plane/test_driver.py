"""The loop driver (``proxy/read_loop/driver.py``) on the Chat Completions door, against an upstream
behind ``httpx.MockTransport``: a read round answered from the store then the final answer with
usage summed over the rounds (JSON, and streamed in chunks cut at awkward places), and every
failure by the one rule: before the response started the client gets the upstream's status and
body (or the proxy's 502), after it the dialect's error event and no ``[DONE]``."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.dialects.chat import ChatDialect
from proxy.read_loop.commands import LoopLimits
from tests.agent_upstream.script import Answer
from tests.proxy.data_plane import chat_wire as chat
from tests.proxy.data_plane.harness import (
    AWKWARD,
    COUNTER,
    HANDLE,
    REQUEST_ID,
    Reply,
    drive,
    json_reply,
    sse_reply,
)

CHAT = ChatDialect()
FINAL = "The build failed because a test timed out."
CONTEXT_ERROR = {
    "error": {
        "message": "This model's maximum context length is 128000 tokens.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}


def refused() -> Reply:
    return json_reply(CONTEXT_ERROR, 400, [("x-request-id", "req_upstream")])


def check_read_round(bodies: list[dict[str, Any]], stream: bool) -> str:
    """The second round is the first plus the read call and its result; the result's text."""
    first, second = bodies
    assert first == chat.body(stream=stream)
    assert second["messages"][: len(first["messages"])] == first["messages"]
    assistant, tool = second["messages"][len(first["messages"]) :]
    assert assistant["tool_calls"] == [chat.read().as_message_part()]
    assert tool["role"] == "tool" and tool["tool_call_id"] == "call_read_1"
    assert "log line 1: ok" in tool["content"] and "log line 3: ok" in tool["content"]
    assert "log line 4: ok" not in tool["content"]
    assert second["tools"] == first["tools"]  # rounds are left: the read tool stays
    text: str = tool["content"]
    return text


async def test_a_json_read_round_then_the_answer_with_usage_summed() -> None:
    run = await drive(
        CHAT,
        chat.body(),
        [
            chat.answer_json(Answer(None, [chat.read()]), chat.usage(120, 15)),
            chat.answer_json(Answer(FINAL), chat.usage(400, 9)),
        ],
    )
    read = check_read_round(run.upstream.bodies, stream=False)
    assert run.store.gets == [HANDLE]
    assert run.client.status == 200 and run.client.complete
    answer = run.client.json()
    assert answer["choices"][0]["message"] == {
        "role": "assistant",
        "content": FINAL,
        "refusal": None,
        "annotations": [],
    }
    assert answer["usage"] == {**chat.usage(400, 9), "completion_tokens": 24, "total_tokens": 424}
    sizes = [CHAT.count(b, COUNTER) for b in run.upstream.bodies]
    headers = run.client.headers
    assert headers[b"x-compaction-read-rounds"] == b"1"
    assert headers[b"x-compaction-tokens-after"] == str(max(sizes)).encode()
    assert headers[b"content-length"] == str(len(run.client.body)).encode()
    assert headers[b"x-request-id"] == REQUEST_ID.encode() and headers[b"x-compaction-policy"] == b"plane"
    # The proxy reads these answers itself: it asks for them uncompressed.
    assert [r.headers.get_list("accept-encoding") for r in run.upstream.requests] == [["identity"]] * 2
    result = run.result
    assert (result.rounds, result.reads, result.round_tokens) == (1, ["ok"], sizes)
    assert result.usage_per_round == [chat.usage(120, 15), chat.usage(400, 9)]
    assert result.bytes_read == len(read.encode()) and result.withdrawn == 0
    assert (result.status, result.error, result.final_answer) == (200, None, [])


@pytest.mark.parametrize(
    ("sizes", "crlf"), [((1,), False), (AWKWARD, False), (AWKWARD, True), ((1 << 16,), False)]
)
async def test_a_streamed_read_round_then_the_answer_with_usage_summed(
    sizes: tuple[int, ...], crlf: bool
) -> None:
    final = chat.answer_events(Answer(FINAL), chat.usage(400, 9))
    run = await drive(
        CHAT,
        chat.body(stream=True),
        [
            chat.answer_sse(
                Answer("Let me read the log.", [chat.read()]), chat.usage(120, 15), sizes=sizes, crlf=crlf
            ),
            sse_reply(final, sizes, crlf=crlf),
        ],
    )
    check_read_round(run.upstream.bodies, stream=True)
    client = run.client
    assert client.status == 200 and client.complete
    assert client.headers[b"content-type"] == b"text/event-stream"
    assert client.headers[b"x-compaction-read-rounds"] == b"1"
    # The client gets the last round's events as the upstream wrote them, its usage summed; the
    # read round (its preamble, its call) never shows.
    *relayed, last_usage, done = client.events()
    assert relayed == [orjson.loads(e[6:]) for e in final[:-2]]
    assert last_usage["usage"] == {**chat.usage(400, 9), "completion_tokens": 24, "total_tokens": 424}
    assert done == b"[DONE]" and client.body.endswith(b"data: [DONE]\n\n")
    assert b"read_tool_output" not in client.body and b"Let me read" not in client.body
    assert run.result.usage_per_round == [chat.usage(120, 15), chat.usage(400, 9)]
    assert (run.result.rounds, run.result.status, run.result.error) == (1, 200, None)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_read_round_refused_before_anything_was_sent_answers_with_its_status_and_body(
    stream: bool,
) -> None:
    first = (chat.answer_sse if stream else chat.answer_json)(
        Answer("Reading.", [chat.read()]), chat.usage(120, 15)
    )
    run = await drive(CHAT, chat.body(stream=stream), [first, refused()])
    client = run.client
    assert client.status == 400 and client.complete
    assert client.body == orjson.dumps(CONTEXT_ERROR)
    assert client.headers[b"content-type"] == b"application/json"
    assert client.headers[b"x-request-id"] == b"req_upstream"  # the upstream's own
    assert client.headers[b"content-length"] == str(len(client.body)).encode()
    assert client.headers[b"x-compaction-read-rounds"] == b"1"
    assert (run.result.status, run.result.error, run.result.rounds) == (400, None, 1)


async def test_a_read_round_refused_after_the_stream_started_ends_with_the_error_event() -> None:
    run = await drive(
        CHAT,
        chat.body(stream=True),
        [chat.answer_sse(Answer(chat.LONG_TEXT, [chat.read()]), chat.usage(120, 15)), refused()],
    )
    client = run.client
    assert client.status == 200 and client.complete
    *relayed, error = client.events()
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in relayed) == chat.LONG_TEXT
    assert error == {
        "error": {
            "message": "The upstream answered HTTP 400 to a read_tool_output round. "
            + CONTEXT_ERROR["error"]["message"],
            "type": "upstream_error",
            "param": None,
            "code": "context_length_exceeded",
        }
    }
    assert b"[DONE]" not in client.body
    assert (run.result.status, run.result.error) == (400, "upstream_error")


@pytest.mark.parametrize("started", [False, True])
async def test_a_stream_the_upstream_closes_early_fails_as_upstream_reset(started: bool) -> None:
    text = chat.LONG_TEXT if started else "The build"
    events = chat.answer_events(Answer(text), chat.usage(120, 15))
    run = await drive(CHAT, chat.body(stream=True), [sse_reply(events[:-3])])  # no finish, no [DONE]
    client = run.client
    assert client.complete and b"[DONE]" not in client.body
    error = {
        "message": "The upstream stream ended before the answer was complete.",
        "type": "upstream_error",
        "param": None,
        "code": "upstream_reset",
    }
    if started:
        assert client.status == 200 and client.events()[-1] == {"error": error}
    else:
        assert client.status == 502 and client.json() == {"error": error}
    assert run.result.error == "upstream_reset"


@pytest.mark.parametrize("started", [False, True])
async def test_a_stream_broken_by_a_reset_connection_fails_as_upstream_reset(started: bool) -> None:
    text = chat.LONG_TEXT if started else "The build"
    events = chat.answer_events(Answer(text), chat.usage(120, 15))
    # One chunk per event; the connection breaks once the text is out, before the finish.
    broken = Reply(chunks=events, headers=[("content-type", "text/event-stream")], fail_after=len(events) - 3)
    run = await drive(CHAT, chat.body(stream=True), [broken])
    client = run.client
    assert client.complete and b"[DONE]" not in client.body
    if started:
        assert client.status == 200
        error = client.events()[-1]["error"]
    else:
        assert client.status == 502
        error = client.json()["error"]
    assert error["code"] == "upstream_reset" and "http://upstream.test" in error["message"]
    assert run.result.error == "upstream_reset"


async def test_an_oversized_event_fails_as_upstream_too_large() -> None:
    huge = b"data: " + b"x" * 70_000  # no blank line: the event never ends
    run = await drive(
        CHAT, chat.body(stream=True), [sse_reply([huge], (4096,))], limits=LoopLimits(max_event_bytes=65_536)
    )
    assert run.client.status == 502 and run.client.complete
    assert run.client.json()["error"] == {
        "message": "The upstream sent an event stream event larger than 65536 bytes during a "
        "read_tool_output round.",
        "type": "upstream_error",
        "param": None,
        "code": "upstream_too_large",
    }
    assert run.result.error == "upstream_too_large"


async def test_an_oversized_event_after_the_stream_started_ends_with_the_error_event() -> None:
    huge = b"data: " + b"x" * 70_000
    run = await drive(
        CHAT,
        chat.body(stream=True),
        [
            chat.answer_sse(Answer(chat.LONG_TEXT, [chat.read()]), chat.usage(120, 15)),
            sse_reply([huge], (4096,)),
        ],
        limits=LoopLimits(max_event_bytes=65_536),
    )
    assert run.client.status == 200 and run.client.complete
    assert run.client.events()[-1]["error"]["code"] == "upstream_too_large"
    assert b"[DONE]" not in run.client.body
    assert run.result.error == "upstream_too_large"


async def test_an_oversized_json_answer_fails_as_upstream_too_large() -> None:
    big = chat.answer_json(Answer("x" * 3000), chat.usage(120, 15))
    run = await drive(CHAT, chat.body(), [big], limits=LoopLimits(max_response_bytes=2048))
    assert run.client.status == 502
    error = run.client.json()["error"]
    assert error["code"] == "upstream_too_large" and "larger than 2048 bytes" in error["message"]
    assert run.result.error == "upstream_too_large"


async def test_when_rounds_run_out_the_last_round_goes_without_the_tool_and_its_reads_are_dropped() -> None:
    run = await drive(
        CHAT,
        chat.body(),
        [
            chat.answer_json(Answer(None, [chat.read()]), chat.usage(120, 15)),
            chat.answer_json(Answer(None, [chat.read("call_read_2")]), chat.usage(300, 5)),
        ],
        limits=LoopLimits(max_rounds=1),
    )
    second = run.upstream.bodies[1]
    assert [t["function"]["name"] for t in second["tools"]] == ["bash"]
    assert run.store.gets == [HANDLE]  # the second read is never run
    choice = run.client.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    assert run.result.rounds == 1 and run.client.headers[b"x-compaction-read-rounds"] == b"1"


async def test_an_answer_that_is_not_one_is_relayed_as_it_came() -> None:
    odd = json_reply({"object": "something.else", "data": [1, 2]})
    run = await drive(CHAT, chat.body(), [odd])
    assert run.client.status == 200 and run.client.body == odd.body
    assert run.result.usage_per_round == [] and run.result.final_answer is None


async def test_an_error_event_of_the_upstreams_own_is_relayed_and_ends_the_stream() -> None:
    error = {"error": {"message": "The server had an error.", "type": "server_error", "code": None}}
    text = chat.answer_events(Answer("The build"), chat.usage(400, 9))[:2]
    run = await drive(
        CHAT,
        chat.body(stream=True),
        [
            chat.answer_sse(Answer("Reading.", [chat.read()]), chat.usage(120, 15)),
            sse_reply([*text, b"data: " + orjson.dumps(error) + b"\n\n"]),
        ],
    )
    client = run.client
    assert client.status == 200 and client.complete
    assert client.events()[-1] == error and b"[DONE]" not in client.body
    assert (run.result.error, run.result.rounds) == ("upstream_error", 1)
