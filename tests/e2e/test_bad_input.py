"""A corpus of malformed and hostile chat requests against the real proxy: each is answered with
a clear OpenAI-style error or passed through, never a 500, under `full` and under `improved`."""

from __future__ import annotations

import json
from typing import Any

import httpx
import orjson
import pytest

from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.e2e

TOOL = {
    "type": "function",
    "function": {"name": "execute_bash", "parameters": {"type": "object", "properties": {}}},
}
CALL = {
    "id": "c1",
    "type": "function",
    "function": {"name": "execute_bash", "arguments": '{"command": "ls"}'},
}


def body(**fields: Any) -> bytes:
    return orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], **fields})


def messages(*items: Any) -> bytes:
    return orjson.dumps({"model": "gpt-4o", "messages": list(items)})


def nested(depth: int) -> bytes:
    return b'{"model": "m", "messages": [{"role": "user", "content": ' + b"[" * depth + b"]" * depth + b"}]}"


LONG = "x" * 2_000_000
CORPUS: dict[str, bytes] = {
    # Broken JSON and wrong top-level types.
    "empty body": b"",
    "whitespace only": b"   \n\t ",
    "truncated object": b'{"model": "m", "messages": [',
    "trailing garbage": body() + b"}}}",
    "single quotes": b"{'model': 'm', 'messages': []}",
    "json array": b"[]",
    "json string": b'"hello"',
    "json number": b"42",
    "json null": b"null",
    "nan literal": b'{"model": "m", "messages": [], "temperature": NaN}',
    "bom prefix": b"\xef\xbb\xbf" + body(),
    "invalid utf-8": b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
    "overlong utf-8": b'{"model": "m", "messages": [{"role": "user", "content": "\xc0\xaf"}]}',
    "deep nesting 5000": nested(5000),
    "deep nesting 200": nested(200),
    # Wrong types in known fields.
    "messages missing": orjson.dumps({"model": "m"}),
    "messages null": orjson.dumps({"model": "m", "messages": None}),
    "messages object": orjson.dumps({"model": "m", "messages": {"role": "user"}}),
    "messages string": orjson.dumps({"model": "m", "messages": "hi"}),
    "messages empty": orjson.dumps({"model": "m", "messages": []}),
    "message is a string": messages("hello"),
    "message is a number": messages(7),
    "message is null": messages(None),
    "message without role": messages({"content": "hi"}),
    "role is a number": messages({"role": 5, "content": "hi"}),
    "unknown role": messages({"role": "wizard", "content": "hi"}),
    "content is a number": messages({"role": "user", "content": 12}),
    "content is an object": messages({"role": "user", "content": {"text": "hi"}}),
    "content parts with junk": messages({"role": "user", "content": [1, None, "s", {"type": "text"}, {}]}),
    "model is a number": orjson.dumps({"model": 4, "messages": [{"role": "user", "content": "hi"}]}),
    "model absent": orjson.dumps({"messages": [{"role": "user", "content": "hi"}]}),
    "model empty": body(model=""),
    "stream is a string": body(stream="yes"),
    "tools is a string": body(tools="execute_bash"),
    "tools with junk": body(tools=[None, 1, "x", {"type": "function"}]),
    "tool_calls is a string": messages(
        {"role": "assistant", "tool_calls": "ls"}, {"role": "user", "content": "go"}
    ),
    "tool_calls with junk": messages(
        {"role": "assistant", "tool_calls": [None, {"id": 3}]}, {"role": "user", "content": "go"}
    ),
    "arguments not json": messages(
        {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "x", "arguments": "{nope"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "ok"},
    ),
    # Protocol problems the client already has.
    "orphan tool result": messages(
        {"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "zz", "content": "x"}
    ),
    "call without result mid-history": messages(
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [CALL]},
        {"role": "user", "content": "again"},
    ),
    "duplicate tool call ids": messages(
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [CALL, CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "a"},
        {"role": "tool", "tool_call_id": "c1", "content": "b"},
    ),
    "tool result before its call": messages(
        {"role": "user", "content": "hi"},
        {"role": "tool", "tool_call_id": "c1", "content": "a"},
        {"role": "assistant", "tool_calls": [CALL]},
    ),
    # Size and unicode.
    "huge string content": messages({"role": "user", "content": LONG}),
    "many tiny messages": messages(*({"role": "user", "content": str(i)} for i in range(20_000))),
    "lone surrogate escapes": b'{"model": "m", "messages": [{"role": "user", '
    b'"content": "\\ud800 and \\udfff"}]}',
    "nul and controls": messages({"role": "user", "content": "a\x00b\x01c\x1f"}),
    "rtl and zero-width": messages({"role": "user", "content": "\u202e\u200b\u200d\ufeff abc"}),
    "emoji and combining": messages({"role": "user", "content": "\U0001f600" * 1000 + "e\u0301" * 1000}),
    "special tokens as text": messages({"role": "user", "content": "<|endoftext|><|im_start|>system"}),
    "enormous tool schemas": body(
        tools=[
            {**TOOL, "function": {**TOOL["function"], "name": f"t{i}", "description": "d" * 5000}}
            for i in range(200)
        ]
    ),
    "huge integer": b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], '
    b'"seed": 123456789012345678901234567890}',
    # Unknown and extra fields; images.
    "unknown top-level fields": body(x_custom={"a": [1, 2]}, metadata={"k": "v"}),
    "unknown message fields": messages(
        {"role": "user", "content": "hi", "x_trace": {"id": 1}, "name": "bob"}
    ),
    "image parts": messages(
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 100_000}},
            ],
        }
    ),
    "long history with lone surrogates": b'{"model": "m", "messages": [{"role": "user", "content": "task"},'
    + b",".join(
        b'{"role": "assistant", "tool_calls": [{"id": "c%d", "type": "function", "function": {"name": "x", '
        b'"arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "c%d", "content": "\\ud800 %s"}'
        % (i, i, b"y " * 400)
        for i in range(12)
    )
    + b"]}",
    "audio part": messages(
        {
            "role": "user",
            "content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}],
        }
    ),
}


def test_the_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= 50


@pytest.mark.parametrize("policy", ["full", "improved", "sre", "n_latest_10"])
def test_hostile_requests_never_get_a_500(start_proxy: Any, upstream: FakeUpstream, policy: str) -> None:
    # A small window, so that the compacting policies act on these requests.
    proxy = start_proxy({"context_windows": {"default": 2048}})
    outcomes: dict[str, int] = {}
    for name, content in CORPUS.items():
        before = len(upstream.requests)
        response = httpx.post(
            proxy.base_url + "/chat/completions",
            content=content,
            headers={"content-type": "application/json", "x-compaction-policy": policy, "x-session-id": name},
            timeout=60,
        )
        outcomes[name] = response.status_code
        assert response.status_code < 500, (name, response.status_code, response.text[:300])
        if response.status_code >= 400:
            error = response.json()["error"]
            assert error["message"] and error["type"], name
            assert len(upstream.requests) == before, f"{name}: refused but forwarded"
        else:
            assert len(upstream.requests) == before + 1, name
    # The refusals are the bodies the proxy cannot read as a chat request.
    refused = {name for name, status in outcomes.items() if status == 400}
    assert {"empty body", "json array", "invalid utf-8", "messages missing", "messages string"} <= refused
    assert "unknown top-level fields" not in refused and "orphan tool result" not in refused


def _deep_tool_result(depth: int) -> dict[str, Any]:
    inner: dict[str, Any] = {"type": "text", "text": "x"}
    for _ in range(depth):
        inner = {"type": "tool_result", "tool_use_id": "t", "content": [inner]}
    return inner


DOOR_CORPUS: dict[str, tuple[str, dict[str, Any]]] = {
    "responses call_id as a list": (
        "/responses",
        {
            "model": "gpt-4o",
            "input": [
                {"type": "message", "role": "user", "content": "hi"},
                {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}"},
                {"type": "function_call_output", "call_id": ["c1"], "output": "x"},
            ],
        },
    ),
    "messages tool_result nested 300 deep": (
        "/messages",
        {
            "model": "claude-sonnet-4-5",
            "max_tokens": 10,
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "b", "input": {}}]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t", "content": [_deep_tool_result(300)]}
                    ],
                },
            ],
        },
    ),
}


@pytest.mark.parametrize("name", sorted(DOOR_CORPUS))
@pytest.mark.parametrize("policy", ["full", "improved"])
def test_junk_on_the_other_doors_is_forwarded_as_sent(
    start_proxy: Any, upstream: FakeUpstream, name: str, policy: str
) -> None:
    """Shapes the Responses and Messages adapters cannot read go upstream byte for byte (the
    upstream's own error answers them), never a 500; the header says why."""
    proxy = start_proxy({"context_windows": {"default": 2048}})
    path, payload = DOOR_CORPUS[name]
    content = json.dumps(payload).encode()  # orjson refuses to write nesting this deep
    response = httpx.post(
        proxy.base_url + path,
        content=content,
        headers={
            "content-type": "application/json",
            "x-compaction-policy": policy,
            "anthropic-version": "2023-06-01",
        },
        timeout=60,
    )
    assert response.status_code < 500, (name, response.status_code, response.text[:300])
    assert upstream.requests and upstream.requests[-1].body == content
    if policy != "full":
        assert response.headers["x-compaction-skipped"].startswith("unreadable")


def test_json_nested_far_deeper_than_any_parser_goes_is_forwarded_as_sent(
    start_proxy: Any, upstream: FakeUpstream
) -> None:
    """10^5 levels: neither parser reads it; the README's promise holds all the same (forwarded
    exactly as sent, the upstream's own parser answers), never a 400 of the proxy's own."""
    proxy = start_proxy({"policy": "improved", "context_windows": {"default": 2048}})
    content = (
        b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "x": ' + nested(100_000) + b"}"
    )
    response = httpx.post(
        proxy.base_url + "/chat/completions",
        content=content,
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert response.status_code < 500
    assert upstream.requests and upstream.requests[-1].body == content
    assert response.headers["x-compaction-skipped"] == "JSON nested too deep to read"
