"""A door's answer read back as the neutral message a model arm continues with
(``replay.session.doors.answer_message``): what the recorded upstream writes in each door's
format (``answer``) comes back as the same text and tool calls."""

from __future__ import annotations

from typing import Any

import pytest

from replay.session.doors import DIALECTS, answer, answer_message

CALL = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"command":"ls"}'}}


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(
    "message",
    [
        {"role": "assistant", "content": "The error is ValueError."},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [CALL]},
        {"role": "assistant", "content": None, "tool_calls": [CALL, {**CALL, "id": "call_2"}]},
    ],
    ids=["text", "text-and-call", "calls"],
)
def test_every_doors_answer_reads_back_as_the_message_written(dialect: str, message: dict[str, Any]) -> None:
    written = answer(dialect, message, "gpt-4o", "a1")
    read = answer_message(dialect, written, "gpt-4o")
    assert read is not None
    assert read["content"] == message["content"]
    assert read.get("tool_calls") == message.get("tool_calls")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_an_error_body_is_no_answer(dialect: str) -> None:
    assert answer_message(dialect, {"error": {"code": 400, "message": "no"}}, "gpt-4o") is None
    assert answer_message(dialect, [], "gpt-4o") is None
