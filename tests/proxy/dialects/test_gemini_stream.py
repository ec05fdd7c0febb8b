"""The Gemini stream codec, one round at a time, against a writer that records what the client
gets: text relayed in the model's order with the finish reason and the usage in the last event;
a read round's preamble, thoughts and call never shown; an agent's call held to the round's end
with what follows it; a signed text part kept apart from the text it follows; an error event
relayed; and the round's parts as the read loop sends them back (``add_round``), the final
JSON without internal calls and the usage summed."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from proxy.dialects import make_dialects
from proxy.dialects.base import HELD_TEXT_CHARS, NOT_RUN, Answer
from proxy.dialects.doors import Target
from proxy.dialects.gemini_stream import GeminiStream, merged_parts
from proxy.telemetry.shadow import FINAL_ANSWER
from proxy.wire.errors import ProxyError
from proxy.wire.response_writer import ResponseWriter
from tests.gemini_upstream import wire

DIALECT = make_dialects()["gemini"].at(Target(model="gemini-3.8-flash", stream=True))
CODE_ASSIST = make_dialects()["code_assist"].at(Target(stream=True))
READ = {
    "functionCall": {"id": "r1", "name": "read_tool_output", "args": {"handle": "out_1"}},
    "thoughtSignature": "c2lnMQ==",
}
SHELL = {
    "functionCall": {"id": "s1", "name": "run_shell_command", "args": {"command": "ls"}},
    "thoughtSignature": "c2lnMg==",
}
THOUGHT = {"text": "Let me look at the saved log.", "thought": True}


class Client:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def __call__(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")

    def events(self) -> list[dict[str, Any]]:
        return [orjson.loads(chunk[6:]) for chunk in self.body.split(b"\n\n") if chunk.startswith(b"data: ")]

    def parts(self) -> list[Any]:
        """The parts the client got, text pieces joined as its SDK joins them."""
        return merged_parts([p for e in self.events() for p in e["candidates"][0]["content"]["parts"]])


async def play(
    parts: list[dict[str, Any]], *, finish: bool = True, dialect: Any = DIALECT
) -> tuple[GeminiStream, Client]:
    client = Client()
    writer = ResponseWriter(client)
    writer.start(200, [], streaming=True)
    stream = dialect.codec(writer)
    envelope = "response" if dialect is CODE_ASSIST else None
    raw = b"".join(wire.events(parts, wire.usage(120, 30), "gemini-3.8-flash", "r-1", envelope))
    for event in raw.split(b"\r\n\r\n"):  # as the driver's framer hands them over
        if event:
            await stream.take(event)
    if finish:
        await stream.finish({"promptTokenCount": 400, "candidatesTokenCount": 45, "totalTokenCount": 445})
    return stream, client


def test_a_final_round_reaches_the_client_with_its_finish_and_the_summed_usage() -> None:
    text = {"text": "The build failed because a test timed out."}
    stream, client = asyncio.run(play([THOUGHT, text]))
    assert stream.complete and stream.error is None and stream.calls() == []
    assert stream.text == text["text"]
    assert "".join(p["text"] for p in client.parts() if not p.get("thought")) == text["text"]
    assert client.parts()[0] == THOUGHT  # the thought goes with the text after it
    last = client.events()[-1]
    assert last["candidates"][0]["finishReason"] == "STOP"
    assert (
        last["usageMetadata"]["promptTokenCount"] == 400 and last["usageMetadata"]["totalTokenCount"] == 445
    )
    assert all("finishReason" not in e["candidates"][0] for e in client.events()[:-1])
    assert client.sent[-1]["more_body"] is False


def test_a_read_rounds_preamble_thought_and_call_never_reach_the_client() -> None:
    preamble = {"text": "Checking the saved log first."}
    stream, client = asyncio.run(play([THOUGHT, preamble, READ], finish=False))
    assert client.body == b""
    assert stream.calls() == [READ] and stream.items() == [THOUGHT, preamble, READ]
    assert DIALECT.is_read_call(stream.calls()[0])


def test_a_long_text_is_relayed_before_the_round_ends() -> None:
    long = {"text": "word " * (HELD_TEXT_CHARS // 4)}
    stream, client = asyncio.run(play([long, READ], finish=False))
    assert b"word word" in client.body and b"read_tool_output" not in client.body
    assert stream.items()[0] == long  # the pieces joined back


def test_an_agents_call_is_held_to_the_end_with_what_follows_it_in_order() -> None:
    after = {"text": "Then I will summarize."}
    _, client = asyncio.run(play([{"text": "Listing."}, SHELL, after]))
    parts = client.parts()
    assert parts[-2:] == [SHELL, after] and parts[0] == {"text": "Listing."}
    # Held parts (the short text too) go out in the last event, with the finish reason.
    last = client.events()[-1]["candidates"][0]["content"]["parts"]
    assert merged_parts(last) == [{"text": "Listing."}, SHELL, after]


def test_a_signed_text_part_is_kept_apart_in_the_round_it_goes_back_with() -> None:
    signed = {"text": "Done.", "thoughtSignature": "c2lnMw=="}
    stream, client = asyncio.run(play([{"text": "All good. "}, signed]))
    items = stream.items()
    assert (
        items[-1]["thoughtSignature"] == "c2lnMw==" and "".join(p["text"] for p in items) == "All good. Done."
    )
    assert any(p.get("thoughtSignature") == "c2lnMw==" for p in client.parts())


def test_an_error_event_is_relayed_as_the_api_writes_it() -> None:
    async def scenario() -> tuple[GeminiStream, Client]:
        client = Client()
        writer = ResponseWriter(client)
        writer.start(200, [], streaming=True)
        stream = DIALECT.codec(writer)
        await stream.take(wire.event(wire.error_body(503, "The model is overloaded."))[:-4])
        return stream, client

    stream, client = asyncio.run(scenario())
    assert stream.error is not None and client.events() == [wire.error_body(503, "The model is overloaded.")]
    own = DIALECT.error_event(ProxyError(502, "upstream reset", code="upstream_reset"))
    assert orjson.loads(own[6:]) == {
        "error": {"code": 502, "message": "upstream reset", "status": "UNAVAILABLE"}
    }


def test_code_assist_events_keep_their_envelope() -> None:
    _, client = asyncio.run(play([{"text": "Hello."}], dialect=CODE_ASSIST))
    events = client.events()
    assert all(set(e) == {"response"} for e in events)
    assert events[-1]["response"]["candidates"][0]["finishReason"] == "STOP"


def test_a_round_goes_back_whole_and_every_call_is_answered_part_for_part() -> None:
    body = {"contents": [{"role": "user", "parts": [{"text": "Why did it fail? handle=out_1"}]}]}
    answer = Answer(calls=[SHELL, READ], text="x", items=[THOUGHT, SHELL, READ])
    sent = DIALECT.add_round(body, answer, [(READ, "log line 1")])
    model, user = sent["contents"][1:]
    assert model == {"role": "model", "parts": [THOUGHT, SHELL, READ]}
    assert user["role"] == "user"
    assert [p["functionResponse"] for p in user["parts"]] == [
        {"name": "run_shell_command", "response": {"error": NOT_RUN}, "id": "s1"},
        {"name": "read_tool_output", "response": {"output": "log line 1"}, "id": "r1"},
    ]


def test_the_final_json_drops_internal_calls_and_sums_the_usage() -> None:
    data = wire.response([{"text": "Done."}, READ], wire.usage(400, 9), "gemini-3.8-flash", "r-2")
    answer = DIALECT.json_answer(data)
    assert answer is not None and answer.calls == [READ] and answer.text == "Done."
    total: dict[str, int] = {}
    DIALECT.add_usage(total, wire.usage(120, 15, thoughts=5))
    DIALECT.add_usage(total, wire.usage(400, 9))
    assert total == {
        "promptTokenCount": 400,
        "candidatesTokenCount": 24,
        "thoughtsTokenCount": 5,
        "totalTokenCount": 429,
    }
    final = orjson.loads(DIALECT.final_json(data, total))
    assert final["candidates"][0]["content"]["parts"] == [{"text": "Done."}]
    assert final["usageMetadata"]["candidatesTokenCount"] == 24
    assert DIALECT.billed([wire.usage(400, 9, cached=300, thoughts=5)]).cached == 300
    assert DIALECT.billed([wire.usage(400, 9, thoughts=5)]).output == 14


def test_the_prompt_tokens_a_relayed_answer_reports() -> None:
    raw = b"".join(wire.events([{"text": "Hi."}], wire.usage(321, 2), "m", "r"))
    assert DIALECT.reported_prompt_tokens(raw, sse=True) == 321
    assert (
        DIALECT.reported_prompt_tokens(
            orjson.dumps(wire.response([], wire.usage(99, 1), "m", "r")), sse=False
        )
        == 99
    )
    assert DIALECT.reported_prompt_tokens(b"{truncated", sse=False) == 0


def test_the_decision_is_the_first_call() -> None:
    raw = b"".join(wire.events([{"text": "Let me see."}, SHELL], wire.usage(10, 2), "m", "r"))
    streamed = DIALECT.decision(raw, sse=True)
    assert streamed != FINAL_ANSWER
    assert (
        DIALECT.decision(orjson.dumps(wire.response([SHELL], wire.usage(1, 1), "m", "r")), sse=False)
        == streamed
    )
    assert (
        DIALECT.decision(orjson.dumps(wire.response([{"text": "ok"}], wire.usage(1, 1), "m", "r")), sse=False)
        == FINAL_ANSWER
    )
