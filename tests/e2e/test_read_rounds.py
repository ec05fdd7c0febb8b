"""Read rounds held to the window, and one rule for a round that fails: the real proxy, a
scripted upstream, the official openai SDK.

Every request the proxy sends upstream, read rounds included, must fit the model's window (the
upstream here checks each one as a real server would), and a round that fails after the
response started must reach the SDK as an error, never as a complete answer."""

from __future__ import annotations

import re
from typing import Any

import openai
import orjson
import pytest

from policies.tokens import TokenCounter
from tests.fake_upstream import FakeUpstream, Recorded, Reply, chunk, completion, text_stream

pytestmark = pytest.mark.e2e

WINDOW = 6000
CONFIG = {"policy": "improved", "context_windows": {"default": WINDOW}, "read_tool": {"max_rounds": 4}}
HANDLE = re.compile(r"handle=(out_[0-9a-f]+)")
COUNTER = TokenCounter()


def history(one_line: bool = False) -> list[Any]:
    """An agent run whose outputs are offloaded at this window; with ``one_line``, each output
    is a single ~10 KB line (mini-swe-agent's tool-call observations are JSON on one line)."""
    messages: list[Any] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the bug."},
    ]
    for i in range(8):
        if one_line:
            output = orjson.dumps(
                {"returncode": 0, "output": " ".join(f"tok{i}x{n}" for n in range(500))}
            ).decode()
        else:
            output = "\n".join(f"line {n} of output {i}: " + "word " * 12 for n in range(120))
        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{i}",
                        "type": "function",
                        "function": {
                            "name": "bash",
                            "arguments": orjson.dumps({"command": f"run {i}"}).decode(),
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"c{i}", "content": output},
        ]
    return messages


def tokens_of(request: Recorded) -> int:
    body = request.json()
    asked = max(body.get("max_tokens") or 0, body.get("max_completion_tokens") or 0)
    return COUNTER.count_request(body).total + asked


def read_call(handle: str, call_id: str, **arguments: Any) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {
            "name": "read_tool_output",
            "arguments": orjson.dumps({"handle": handle, **arguments}).decode(),
        },
    }


def reads_every_handle(first_only: bool = False, **arguments: Any) -> Reply:
    def decide(request: Recorded) -> Reply:
        handles = list(dict.fromkeys(HANDLE.findall(request.body.decode())))[: 1 if first_only else None]
        calls = [read_call(h, f"r{i}", **arguments) for i, h in enumerate(handles)]
        return Reply(body=completion(tool_calls=calls))

    return Reply(dynamic=decide)


def sdk(proxy: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key="sk-rounds-000000000000", max_retries=0)


@pytest.mark.parametrize("one_line", [False, True])
def test_every_read_round_fits_the_window(start_proxy: Any, upstream: FakeUpstream, one_line: bool) -> None:
    proxy = start_proxy(CONFIG)
    upstream.queue(
        reads_every_handle(one_line, num_lines=400),
        reads_every_handle(one_line, pattern="tok|line"),
        reads_every_handle(one_line, start_line=1, num_lines=40),
        Reply(body=completion("done")),
    )
    answer = sdk(proxy).chat.completions.with_raw_response.create(
        model="m", messages=history(one_line), max_tokens=500
    )
    assert answer.parse().choices[0].message.content == "done"
    sizes = [tokens_of(r) for r in upstream.requests]
    assert len(sizes) == 4 and max(sizes) <= WINDOW, sizes
    # The header reports the largest request actually sent, not the first round's.
    assert int(answer.headers["x-compaction-tokens-after"]) >= max(sizes) - 500 - 50
    results = [m for m in upstream.requests[-1].json()["messages"] if m["role"] == "tool"]
    read_results = [m["content"] for m in results if m["tool_call_id"].startswith("r")]
    assert read_results and any("continue with start_line=" in r or "No room" in r for r in read_results)
    if one_line:
        assert any("line clipped" in r for r in read_results)


def test_limits_per_answer(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy(
        {
            **CONFIG,
            "context_windows": {"default": 12_000},
            "read_tool": {"max_calls_per_answer": 2, "max_total_bytes": 2048},
        }
    )

    def many_reads(request: Recorded) -> Reply:
        handle = HANDLE.findall(request.body.decode())[0]
        return Reply(body=completion(tool_calls=[read_call(handle, f"r{i}") for i in range(5)]))

    upstream.queue(Reply(dynamic=many_reads), Reply(body=completion("enough")))
    answer = sdk(proxy).chat.completions.create(model="m", messages=history())
    assert answer.choices[0].message.content == "enough"
    follow_up = upstream.requests[1].json()
    results = [
        m["content"]
        for m in follow_up["messages"]
        if m["role"] == "tool" and m["tool_call_id"].startswith("r")
    ]
    assert len(results) == 5
    assert sum("at most 2 reads per answer" in r for r in results) == 3
    assert sum(len(r.encode()) for r in results) <= 2048 + 3 * 200
    # Past the byte limit the read tool is withdrawn; the model goes on without it.
    assert "tools" not in follow_up and "tool_choice" not in follow_up


def stream_read_then(request: Recorded) -> Reply:
    """A first round that streams some text, then calls read_tool_output."""
    handle = HANDLE.findall(request.body.decode())[0]
    call = {
        **chunk(None),
        "choices": [
            {
                "index": 0,
                "delta": {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "r1",
                            "type": "function",
                            "function": {
                                "name": "read_tool_output",
                                "arguments": orjson.dumps({"handle": handle, "num_lines": 5}).decode(),
                            },
                        }
                    ]
                },
                "finish_reason": None,
            }
        ],
    }
    return Reply(
        kind="sse",
        chunks=[chunk("", role=True), chunk(PREAMBLE), call, chunk(None, finish="tool_calls")],
    )


# Text a read round writes before its call: short, it is held back and never reaches the client;
# longer than what the proxy holds (HELD_TEXT_CHARS), the stream has started with it.
PREAMBLE = "Let me look. "
LONG_PREAMBLE = "Let me look. " + "I will check the saved output for the failing test first. " * 8


def stream_long_read_then(request: Recorded) -> Reply:
    reply = stream_read_then(request)
    reply.chunks[1] = chunk(LONG_PREAMBLE)
    return reply


def silent_read(request: Recorded) -> Reply:
    """A first round that only calls read_tool_output (no text reaches the client)."""
    handle = HANDLE.findall(request.body.decode())[0]
    call = read_call(handle, "r1", num_lines=5)
    if not request.json().get("stream"):
        return Reply(body=completion(tool_calls=[call]))
    delta = {"index": 0, **call}
    calls = {
        **chunk(None),
        "choices": [{"index": 0, "delta": {"tool_calls": [delta]}, "finish_reason": None}],
    }
    return Reply(kind="sse", chunks=[chunk("", role=True), calls, chunk(None, finish="tool_calls")])


@pytest.mark.parametrize(
    "failure",
    [
        Reply(status=500, body={"error": {"message": "boom", "type": "server_error", "code": None}}),
        Reply(kind="sse", chunks=[chunk("", role=True), chunk("partial "), chunk("more")], reset_after=2),
        Reply(kind="sse", chunks=[chunk("", role=True), chunk("cut short")], done=False),
    ],
    ids=["http-500", "reset", "no-finish"],
)
def test_a_failed_round_after_text_is_an_error_in_the_stream(
    start_proxy: Any, upstream: FakeUpstream, failure: Reply
) -> None:
    proxy = start_proxy(CONFIG)
    upstream.queue(Reply(dynamic=stream_long_read_then), failure)
    stream = sdk(proxy).chat.completions.create(model="m", messages=history(), stream=True)
    text = ""
    with pytest.raises(openai.APIError):
        for part in stream:
            for choice in part.choices:
                text += choice.delta.content or ""
    assert text.startswith(LONG_PREAMBLE)


def test_a_read_rounds_short_preamble_reaches_no_client_streamed_or_not(
    start_proxy: Any, upstream: FakeUpstream
) -> None:
    """ "Let me look." before a read call: dropped in both modes, so a client that parses the
    final text (structured output) gets the same answer streamed or not."""
    proxy = start_proxy(CONFIG)
    upstream.queue(
        Reply(dynamic=stream_read_then), Reply(kind="sse", chunks=text_stream(['{"ok": ', "true}"]))
    )
    parts = sdk(proxy).chat.completions.create(model="m", messages=history(), stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)

    def json_read_then(request: Recorded) -> Reply:
        handle = HANDLE.findall(request.body.decode())[0]
        return Reply(body=completion(PREAMBLE, tool_calls=[read_call(handle, "r1", num_lines=5)]))

    upstream.queue(Reply(dynamic=json_read_then), Reply(body=completion('{"ok": true}')))
    whole = sdk(proxy).chat.completions.create(model="m", messages=history()).choices[0].message.content
    assert streamed == whole == '{"ok": true}'
    # The model itself saw its words: they go back with its read call in the next round.
    assert PREAMBLE in orjson.dumps(upstream.requests[1].json()["messages"]).decode()


def test_a_failed_round_before_any_text_keeps_its_real_status(
    start_proxy: Any, upstream: FakeUpstream
) -> None:
    proxy = start_proxy(CONFIG)
    limited = Reply(
        status=429,
        body={
            "error": {"message": "slow down", "type": "rate_limit_exceeded", "code": "rate_limit_exceeded"}
        },
        headers={"retry-after": "7"},
    )
    upstream.queue(Reply(dynamic=silent_read), limited)
    with pytest.raises(openai.RateLimitError) as raised:
        sdk(proxy).chat.completions.create(model="m", messages=history(), stream=True)
    assert raised.value.response.headers["retry-after"] == "7"
    upstream.queue(Reply(dynamic=silent_read), limited)
    with pytest.raises(openai.RateLimitError):
        sdk(proxy).chat.completions.create(model="m", messages=history())


def test_a_stream_at_the_round_limit_never_hands_the_agent_a_read(
    start_proxy: Any, upstream: FakeUpstream
) -> None:
    proxy = start_proxy({**CONFIG, "read_tool": {"max_rounds": 1}})
    upstream.queue(Reply(dynamic=silent_read), Reply(dynamic=stream_read_then))
    stream = sdk(proxy).chat.completions.create(model="m", messages=history(), stream=True)
    text, calls, finishes = "", 0, []
    for part in stream:
        for choice in part.choices:
            text += choice.delta.content or ""
            calls += len(choice.delta.tool_calls or [])
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
    assert text == "Let me look. " and calls == 0 and finishes == ["stop"]
    assert "tools" not in upstream.requests[-1].json()


HOSTILE_CONFIG = {
    **CONFIG,
    "upstream": {"max_response_bytes": 1 << 20, "max_event_bytes": 1 << 16},
}


def huge_json_round(request: Recorded) -> Reply:
    """A read round answered with a JSON body far past the limit (one long string)."""
    return Reply(body=b'{"choices": [{"message": {"content": "' + b"x" * (8 << 20) + b'"}}]}')


def huge_event_round(request: Recorded) -> Reply:
    """A read round answered with one event that never ends (a 4 MB line, no blank line)."""
    return Reply(kind="sse", chunks=[b"data: " + b"y" * (4 << 20)], done=False)


@pytest.mark.parametrize("stream", [False, True])
def test_a_hostile_answer_to_a_read_round_is_a_clean_named_error(
    start_proxy: Any, upstream: FakeUpstream, stream: bool
) -> None:
    """Bounded memory and a named error: a JSON answer past upstream.max_response_bytes, or one
    stream event past upstream.max_event_bytes, ends the request by the one failure rule."""
    proxy = start_proxy(HOSTILE_CONFIG)
    upstream.queue(Reply(dynamic=silent_read), Reply(dynamic=huge_event_round if stream else huge_json_round))
    client = sdk(proxy)
    with pytest.raises(openai.APIError) as raised:
        if stream:
            for _ in client.chat.completions.create(model="m", messages=history(), stream=True):
                pass
        else:
            client.chat.completions.create(model="m", messages=history())
    assert "larger than" in str(raised.value)
    if not stream:
        assert isinstance(raised.value, openai.APIStatusError) and raised.value.status_code == 502
        assert raised.value.body["code"] == "upstream_too_large"  # type: ignore[index]


def test_a_stream_of_several_choices_is_never_offered_the_read_tool(
    start_proxy: Any, upstream: FakeUpstream
) -> None:
    """``n: 2`` with ``stream: true``: both choices would have to read inside one interleaved
    stream, so the tool is not offered and nothing of it can reach the client."""
    proxy = start_proxy(CONFIG)
    upstream.queue(Reply(kind="sse", chunks=[chunk("fine", role=True), chunk(None, finish="stop")]))
    response = sdk(proxy).chat.completions.create(model="m", messages=history(), stream=True, n=2)
    text = "".join(c.choices[0].delta.content or "" for c in response if c.choices)
    assert text == "fine"
    sent = upstream.requests[-1].json()
    assert "read_tool_output" not in orjson.dumps(sent.get("tools") or []).decode()
    assert "handle=out_" in orjson.dumps(sent["messages"]).decode()  # the view still names them
