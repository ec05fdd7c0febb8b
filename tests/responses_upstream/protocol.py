"""What the fake Responses model shares with the real API: the names the scripted run relies
on, the item types of ``input``, OpenAI's own error bodies, and how a failure is injected."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

READ_TOOL = "read_tool_output"
HANDLE = re.compile(r"handle=(out_[0-9a-f]{16})")
DONE_PREFIX = "DONE:"
SUMMARY_PREFIX = "SUMMARY:"
RUN_HEADER = "x-agent-run"
CALLS = frozenset({"function_call", "custom_tool_call", "local_shell_call"})
OUTPUTS = {
    "function_call_output": "function_call",
    "custom_tool_call_output": "custom_tool_call",
    "local_shell_call_output": "local_shell_call",
}
# Items a model produces (what may follow a reasoning item in its turn).
MODEL_ITEMS = frozenset({"reasoning", "message", *CALLS})
CONTEXT_MESSAGE = (
    "Your input exceeds the context window of this model. Please adjust your input and try again."
)


def context_length_error() -> dict[str, Any]:
    """The Responses API's own answer to an input over the model's context window (HTTP 400)."""
    return {
        "error": {
            "message": CONTEXT_MESSAGE,
            "type": "invalid_request_error",
            "param": "input",
            "code": "context_length_exceeded",
        }
    }


def invalid_request(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": "input", "code": None}}


def server_error() -> dict[str, Any]:
    return {
        "error": {
            "message": "The server had an error while processing your request. Sorry about that!",
            "type": "server_error",
            "param": None,
            "code": "server_error",
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
    """How to fail a read follow-up round. ``status``: answer ``status`` with an OpenAI error
    body (500 ``server_error``, 429 ``rate_limit_exceeded`` with ``retry-after: 0``).
    ``reset``: send ``after_events`` events of the answer's stream and cut the connection (a
    non-streamed request is cut before any byte)."""

    kind: Literal["status", "reset"] = "status"
    status: int = 500
    after_events: int = 4

    def error_body(self) -> dict[str, Any]:
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


def input_items(body: dict[str, Any]) -> list[Any]:
    """A request's ``input`` as items (a string input is one user message)."""
    raw = body.get("input")
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": raw}]
    return raw if isinstance(raw, list) else []


def item_kind(item: Any) -> str | None:
    """An input item's type (``message`` when it has none, as the API reads it)."""
    return item.get("type", "message") if isinstance(item, dict) else None
