"""What the fake Chat Completions model shares with the real API: the names the scripted run
relies on, OpenAI's own error bodies, and the tool-call protocol every request must keep."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

READ_TOOL = "read_tool_output"
HANDLE = re.compile(r"handle=(out_[0-9a-f]+)")
DONE_PREFIX = "DONE:"
STEP_MARK = "AGENT-STEP"
RUN_HEADER = "x-agent-run"


def context_length_error(window: int, tokens: int) -> dict[str, Any]:
    """OpenAI's own answer to a request over the model's context window (HTTP 400)."""
    return {
        "error": {
            "message": (
                f"This model's maximum context length is {window} tokens. However, your messages "
                f"resulted in {tokens} tokens. Please reduce the length of the messages."
            ),
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


# How each kind of server says the request is over its window (each in its own words; see
# proxy/upstream/window_words.py, which must understand every one of them).
def refusal_body(flavor: str, window: int, tokens: int) -> dict[str, Any]:
    if flavor == "openai":
        return context_length_error(window, tokens)
    if flavor == "vllm":  # vLLM's OpenAI-compatible server (HTTP 400, type BadRequestError)
        message = (
            f"This model's maximum context length is {window} tokens. However, you requested {tokens} "
            f"tokens ({tokens} in the messages, 0 in the completion). Please reduce the length of the "
            "messages or completion."
        )
        return {
            "object": "error",
            "message": message,
            "type": "BadRequestError",
            "param": None,
            "code": 400,
            "error": {"message": message, "type": "BadRequestError", "param": None, "code": 400},
        }
    if flavor == "llamacpp":  # llama.cpp's server
        return {
            "error": {
                "code": 400,
                "message": f"request ({tokens} tokens) exceeds the available context size "
                f"({window} tokens), try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": tokens,
                "n_ctx": window,
            }
        }
    if flavor == "ollama":
        return {
            "error": {
                "message": f"input ({tokens} tokens) is longer than the model's context length "
                f"({window} tokens)",
                "type": "api_error",
                "param": None,
                "code": None,
            }
        }
    if flavor == "lmstudio":
        return {
            "error": f"Trying to keep the first {tokens} tokens when context the overflows. However, the "
            f"model is loaded with context length of only {window} tokens, which is not enough. Try to "
            "load the model with a larger context length, or provide a shorter input"
        }
    if flavor == "anthropic":
        return {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": f"prompt is too long: {tokens} tokens > {window} maximum",
            },
        }
    raise ValueError(f"unknown flavor {flavor!r}")


def server_error() -> dict[str, Any]:
    return {
        "error": {
            "message": "The server had an error while processing your request. Sorry about that!",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }


def rate_limit_error() -> dict[str, Any]:
    return {
        "error": {
            "message": "Rate limit reached for agent-model on requests per min (RPM): Limit 3, Used 3.",
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }


@dataclass(frozen=True)
class Failure:
    """How to fail a read follow-up round.

    ``status``: answer ``status`` with an OpenAI error body (500 ``server_error``, 429
    ``rate_limit_exceeded``, or ``body``). ``reset``: start the answer, send ``after_chunks``
    SSE events of it (a streamed request) and cut the connection; a non-streamed request is cut
    before any byte of the answer.
    """

    kind: Literal["status", "reset"] = "status"
    status: int = 500
    body: dict[str, Any] | None = None
    after_chunks: int = 2

    def error_body(self) -> dict[str, Any]:
        if self.body is not None:
            return self.body
        return rate_limit_error() if self.status == 429 else server_error()


def message_text(content: Any) -> str:
    """The text of a message's ``content``: a string, or the text parts of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "") if isinstance(part, dict) and isinstance(part.get("text"), str) else ""
            for part in content
        )
    return ""


def protocol_problems(messages: list[Any]) -> list[str]:
    """Tool-call protocol problems of a message list: every assistant tool call is answered
    by a ``tool`` message before the next non-tool message, and no ``tool`` message answers
    a call that was not made (or was answered already)."""
    problems: list[str] = []
    pending: dict[str, str] = {}  # call id -> tool name, of the last assistant message
    answered: set[str] = set()
    for position, message in enumerate(messages):
        if not isinstance(message, dict):
            problems.append(f"message {position} is not an object")
            continue
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or call_id not in pending:
                where = "answered twice" if call_id in answered else "without a matching earlier call"
                problems.append(f"message {position}: tool result {call_id!r} {where}")
            else:
                del pending[call_id]
                answered.add(call_id)
            continue
        if pending:
            problems.append(
                f"message {position} ({role}): tool call(s) {sorted(pending)} not answered before it"
            )
            pending = {}
        if role == "assistant":
            for call in message.get("tool_calls") or []:
                call_id = call.get("id") if isinstance(call, dict) else None
                if not isinstance(call_id, str) or not call_id:
                    problems.append(f"message {position}: a tool call without an id")
                    continue
                if call_id in answered or call_id in pending:
                    problems.append(f"message {position}: tool call id {call_id!r} used twice")
                function = call.get("function") or {}
                pending[call_id] = str(function.get("name"))
    if pending:
        problems.append(f"the request ends with unanswered tool call(s) {sorted(pending)}")
    return problems


def _calls_by_id(messages: list[Any]) -> dict[str, str]:
    names: dict[str, str] = {}
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "assistant":
            for call in message.get("tool_calls") or []:
                if isinstance(call, dict) and isinstance(call.get("id"), str):
                    names[call["id"]] = str((call.get("function") or {}).get("name"))
    return names


def is_read_follow_up(messages: list[Any]) -> bool:
    """The request ends with the result of a ``read_tool_output`` call: the proxy asks again
    after answering a read."""
    names = _calls_by_id(messages)
    for message in reversed(messages):
        if not isinstance(message, dict) or message.get("role") != "tool":
            return False
        if names.get(str(message.get("tool_call_id"))) == READ_TOOL:
            return True
    return False
