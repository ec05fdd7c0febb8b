"""Dialect adapters: one per wire format the proxy compacts (see ``base.py``), and the doors:
which request (method and path) each one reads, and which provider such a request goes to
(``doors.py``: a door's path may name the model, and its row may say whether it streams)."""

from __future__ import annotations

from proxy.dialects.anthropic import AnthropicDialect
from proxy.dialects.base import Dialect
from proxy.dialects.chat import ChatDialect
from proxy.dialects.doors import BODY_SAYS, Door, DoorTable, Target
from proxy.dialects.gemini import GeminiDialect
from proxy.dialects.gemini_code_assist import CodeAssistDialect
from proxy.dialects.gemini_count import GeminiCountDialect
from proxy.dialects.hidden_rounds import HiddenRounds
from proxy.dialects.responses import ResponsesCompactDialect, ResponsesDialect

_SSE = (b"alt", b"sse")

# `/v1/responses/compact` is answered by the proxy or relayed as sent (`compact.answer`). Every
# other route, `GET /v1/responses/{id}`, `/v1/messages/count_tokens`, a Gemini stream without
# `alt=sse` and every other Gemini and Code Assist method (Code Assist's countTokens too)
# included, is relayed verbatim.
DOORS: tuple[Door, ...] = (
    Door(b"POST", b"/v1/chat/completions", "chat", "openai", "OpenAI Chat Completions"),
    Door(b"POST", b"/v1/responses", "responses", "openai", "OpenAI Responses"),
    Door(
        b"POST",
        b"/v1/responses/compact",
        "responses_compact",
        "openai",
        "OpenAI Responses compact (remote compaction)",
        stream=False,
    ),
    Door(b"POST", b"/v1/messages", "anthropic", "anthropic", "Anthropic Messages"),
    Door(
        b"POST",
        b"/v1beta/models/{model}:generateContent",
        "gemini",
        "gemini",
        "Gemini generateContent",
        stream=False,
    ),
    Door(
        b"POST",
        b"/v1beta/models/{model}:streamGenerateContent",
        "gemini",
        "gemini",
        "Gemini streamGenerateContent (alt=sse)",
        stream=True,
        query=_SSE,
    ),
    Door(
        b"POST",
        b"/v1beta/models/{model}:countTokens",
        "gemini_count",
        "gemini",
        "Gemini countTokens, of the compacted view",
        stream=False,
    ),
    Door(
        b"POST",
        b"/v1internal:generateContent",
        "code_assist",
        "code_assist",
        "Gemini Code Assist",
        stream=False,
    ),
    Door(
        b"POST",
        b"/v1internal:streamGenerateContent",
        "code_assist",
        "code_assist",
        "Gemini Code Assist, streamed (alt=sse)",
        stream=True,
        query=_SSE,
    ),
)


def make_dialects(hidden: HiddenRounds | None = None) -> dict[str, Dialect]:
    """``hidden``: the read rounds Anthropic clients never saw (None in a worker process)."""
    return {
        "chat": ChatDialect(),
        "responses": ResponsesDialect(),
        "responses_compact": ResponsesCompactDialect(),
        "anthropic": AnthropicDialect(hidden),
        "gemini": GeminiDialect(),
        "gemini_count": GeminiCountDialect(),
        "code_assist": CodeAssistDialect(),
    }


__all__ = ["BODY_SAYS", "DOORS", "Dialect", "Door", "DoorTable", "Target", "make_dialects"]
