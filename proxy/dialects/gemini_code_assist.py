"""Gemini CLI's Code Assist path (``POST /v1internal:generateContent`` and
``:streamGenerateContent?alt=sse``, a Google login's route): the Gemini API's format in an
envelope. A request is ``{model, project, user_prompt_id, request: {...a generateContent
body...}}`` (the model in the body, not the path) and every answer, each streamed event too,
is ``{"response": {...a GenerateContentResponse...}}``. Everything inside is read, written and
answered as on the Gemini door; the envelope's other fields go as they came.

The history is nested in ``request``, so a body is read whole every time (``history_field``
names a field that is no list: the known-bodies fast path does not apply).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from policies.conversation import Message
from proxy.dialects.gemini import GeminiDialect
from proxy.dialects.gemini_from_chat import gemini_request, gemini_response


class CodeAssistDialect(GeminiDialect):
    name = "code_assist"
    envelope = "response"
    history_field = "request"

    def model_of(self, body: dict[str, Any]) -> Any:
        return body.get("model") if isinstance(body, dict) else None

    def inner(self, body: dict[str, Any]) -> dict[str, Any]:
        request = body.get("request")
        return request if isinstance(request, dict) else {}

    def outer(self, body: dict[str, Any], inner: dict[str, Any]) -> dict[str, Any]:
        return {**body, "request": inner}

    def client_request(self, model: str, messages: Sequence[Message], tools: Sequence[Any]) -> dict[str, Any]:
        return {"model": model, "project": "replay", "request": gemini_request(model, messages, tools)}

    def answer_from_chat(
        self, message: Message, model: Any, answer_id: str, usage: dict[str, Any] | None
    ) -> dict[str, Any]:
        return {"response": gemini_response(message, model, answer_id, usage)}
