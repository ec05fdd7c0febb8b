"""Chat Completions requests and answers for the data-plane tests, in OpenAI's wire shapes
(``tests/agent_upstream/wire.py`` encodes them: a ``chat.completion``, or its
``chat.completion.chunk`` events with ``"usage": null`` on each chunk, a usage-only chunk and
``[DONE]``)."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.dialects.chat import ChatDialect
from tests.agent_upstream import wire
from tests.agent_upstream.script import Answer, Call
from tests.proxy.data_plane.harness import HANDLE, Reply, json_reply, sse_reply

MODEL = "gpt-4o"
BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}
# A read round's text longer than the part a codec holds back: it reaches the client at once.
LONG_TEXT = "I will look at the saved build log before I change anything. " * 10


def body(*, stream: bool = False, filler: int = 0) -> dict[str, Any]:
    """A compacted view naming a saved output, the read tool offered (``filler``: words of an
    earlier user message, to fill the window)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    if filler:
        messages.append({"role": "user", "content": " ".join(["word"] * filler)})
    messages.append(
        {"role": "user", "content": f"Why did the build fail? Its log was saved: handle={HANDLE}"}
    )
    request: dict[str, Any] = {"model": MODEL, "messages": messages, "tools": [BASH]}
    if stream:
        request |= {"stream": True, "stream_options": {"include_usage": True}}
    return ChatDialect().with_read_tool(request, 1000)


def read(call_id: str = "call_read_1", **arguments: Any) -> Call:
    arguments = {"handle": HANDLE, "num_lines": 3, **arguments}
    return Call(call_id, "read_tool_output", orjson.dumps(arguments).decode())


def bash(call_id: str = "call_bash_1") -> Call:
    return Call(call_id, "bash", '{"command": "make test"}')


def usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
    }


def answer_json(said: Answer, use: dict[str, Any]) -> Reply:
    return json_reply(wire.completion(MODEL, "chatcmpl-plane", said, use))


def answer_events(said: Answer, use: dict[str, Any] | None) -> list[bytes]:
    return wire.chunks(MODEL, "chatcmpl-plane", said, use)


def answer_sse(said: Answer, use: dict[str, Any] | None, **options: Any) -> Reply:
    return sse_reply(answer_events(said, use), **options)
