"""Gemini's ``countTokens`` (``POST /v1beta/models/{model}:countTokens``), answered from the
compacted view: a client's own counter (Gemini CLI counts media parts so) sees what the model
will see, not the history it sent.

The body is ``{"contents": [...]}`` or ``{"generateContentRequest": {model, contents,
systemInstruction, tools, ...}}``; it is read and compacted as the ``generateContent`` request
of the same history would be (the same session, the same checkpoint: a count made before a
compaction point makes the point the next request finds), and the view goes upstream as a
``countTokens`` request, so the upstream counts it. A view that needs more than ``contents``
(the read tool it would be offered, a note in ``systemInstruction``) goes as a
``generateContentRequest`` for the path's model. The answer (``{"totalTokens": n}``) is
relayed as it comes: it is never a model's answer.
"""

from __future__ import annotations

from typing import Any

from proxy.dialects.base import Answer
from proxy.dialects.gemini import GeminiDialect

_REQUEST = "generateContentRequest"


class GeminiCountDialect(GeminiDialect):
    name = "gemini_count"

    def inner(self, body: dict[str, Any]) -> dict[str, Any]:
        request = body.get(_REQUEST)
        return request if isinstance(request, dict) else body

    def outer(self, body: dict[str, Any], inner: dict[str, Any]) -> dict[str, Any]:
        if isinstance(body.get(_REQUEST), dict):
            return {**body, _REQUEST: inner}
        if set(inner) <= {"contents"}:
            return {**body, "contents": inner["contents"]}
        # Only ``contents`` may stand beside the request: the rest goes in a whole request.
        others = {k: v for k, v in body.items() if k != "contents"}
        return {**others, _REQUEST: {"model": f"models/{self.target.model}", **inner}}

    def json_answer(self, data: Any) -> Answer | None:
        return None  # a count, relayed as it comes
