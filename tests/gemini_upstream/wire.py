"""An answer on the wire, exactly as the Gemini API writes it, and its errors in its words.

Non-streamed: a ``GenerateContentResponse`` (``candidates[0]`` with ``content: {role: model,
parts}``, ``finishReason: STOP``, ``index``; ``usageMetadata``; ``modelVersion``;
``responseId``). Streamed (``alt=sse``): ``data: {GenerateContentResponse}`` events ended by
``\\r\\n\\r\\n`` as Google's servers end them, each holding the next parts: thought parts first,
text in a few pieces, each ``functionCall`` whole (its ``thoughtSignature`` on the same part);
every event carries the usage so far (the prompt's, and the candidates' up to it), the last one
``finishReason``. No end marker. Errors: ``{"error": {"code", "message", "status"}}``.
"""

from __future__ import annotations

from typing import Any

import orjson

END = b"\r\n\r\n"


def usage(prompt: int, output: int, *, cached: int = 0, thoughts: int = 0) -> dict[str, Any]:
    found: dict[str, Any] = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": output,
        "totalTokenCount": prompt + output + thoughts,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}],
    }
    if cached:
        found["cachedContentTokenCount"] = cached
    if thoughts:
        found["thoughtsTokenCount"] = thoughts
    return found


def response(
    parts: list[dict[str, Any]],
    use: dict[str, Any],
    model: str,
    response_id: str,
    finish: str | None = "STOP",
) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    return {"candidates": [candidate], "usageMetadata": use, "modelVersion": model, "responseId": response_id}


def pieces(text: str, count: int) -> list[str]:
    if not text:
        return [text]
    size = max(1, -(-len(text) // count))
    return [text[i : i + size] for i in range(0, len(text), size)]


def event(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + END


def stream_parts(parts: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The parts of an answer as its events carry them: a text in three pieces (a signed text's
    signature on its last piece), every other part whole in an event of its own."""
    chunks: list[list[dict[str, Any]]] = []
    for part in parts:
        text = part.get("text")
        if isinstance(text, str) and not part.get("thought"):
            split = pieces(text, 3)
            extra = {k: v for k, v in part.items() if k != "text"}
            chunks += [[{"text": p}] for p in split[:-1]]
            chunks.append([{"text": split[-1], **extra}])
        else:
            chunks.append([part])
    return chunks


def events(
    parts: list[dict[str, Any]],
    use: dict[str, Any],
    model: str,
    response_id: str,
    envelope: str | None = None,
) -> list[bytes]:
    chunks = stream_parts(parts)
    out: list[bytes] = []
    output = use.get("candidatesTokenCount", 0)
    for number, chunk in enumerate(chunks, start=1):
        last = number == len(chunks)
        so_far = {**use, "candidatesTokenCount": output * number // len(chunks)}
        so_far["totalTokenCount"] = so_far["promptTokenCount"] + so_far["candidatesTokenCount"]
        payload = response(chunk, use if last else so_far, model, response_id, "STOP" if last else None)
        out.append(event({envelope: payload} if envelope else payload))
    return out


_STATUSES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND"}
_STATUSES |= {429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}


def error_body(code: int, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "status": _STATUSES.get(code, "UNKNOWN")}}


def too_many_tokens(tokens: int, window: int) -> dict[str, Any]:
    """The API's refusal of a prompt over the model's input limit (HTTP 400)."""
    return error_body(
        400, f"The input token count ({tokens}) exceeds the maximum number of tokens allowed ({window})."
    )


def bad_key() -> dict[str, Any]:
    return {
        "error": {
            "code": 400,
            "message": "API key not valid. Please pass a valid API key.",
            "status": "INVALID_ARGUMENT",
            "details": [
                {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID"},
            ],
        }
    }
