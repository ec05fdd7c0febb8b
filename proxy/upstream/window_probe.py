"""Asking an upstream for a model's context window, once, where it can tell.

The questions, in order, each answered from the provider's own metadata (read by
``window_words``); the first that names a window wins:

1. ``GET <base>/models``: vLLM (``max_model_len``), OpenRouter (``context_length``), LM Studio
   and other OpenAI-compatible servers that list it;
2. ``GET <root>/props``: llama.cpp's server (``n_ctx`` of a slot);
3. ``POST <root>/api/show``: Ollama (the ``num_ctx`` it runs the model with);
4. ``GET <root>/api/v0/models/<model>``: LM Studio's own API (``loaded_context_length``).

The root-level questions (2-4) are asked only of servers that are not one of the hosted APIs
known to have none of them. The whole probe is bounded in time and bytes; a failure of any
kind is an answer of "not known" (the provider's refusal will still teach the window).
Credentials: only the request's own credential headers go, to the provider that request
addresses, for that request's model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import orjson

from proxy.upstream.pool import Upstream
from proxy.upstream.window_words import (
    window_from_llamacpp_props,
    window_from_models,
    window_from_ollama_show,
)
from proxy.wire.forwarding import UpstreamBase

Headers = list[tuple[bytes, bytes]]
# A model listing can be large (OpenRouter lists hundreds of models): read at most this much.
MAX_METADATA_BYTES = 8 * 1024 * 1024
_CREDENTIALS = frozenset({b"authorization", b"api-key", b"x-api-key", b"x-goog-api-key"})
# Hosted APIs that answer none of the local servers' metadata routes.
_HOSTED = (
    "api.openai.com",
    "api.anthropic.com",
    "openrouter.ai",
    "api.groq.com",
    "api.mistral.ai",
    "api.deepseek.com",
    "api.together.xyz",
    "generativelanguage.googleapis.com",
)


@dataclass(frozen=True, slots=True)
class ProbeAnswer:
    window: int
    source: str  # e.g. "GET /v1/models max_model_len"


@dataclass(frozen=True, slots=True)
class _Question:
    method: str
    url: str
    body: bytes
    read: Callable[[Any], int | None]
    source: str


def _questions(base: UpstreamBase, model: str) -> list[_Question]:
    origin = f"{base.scheme}://{base.netloc}"
    asked = [
        _Question(
            "GET",
            f"{origin}{base.prefix}/models",
            b"",
            lambda d: window_from_models(d, model),
            f"GET {base.prefix}/models",
        ),
    ]
    if not any(base.host == h or base.host.endswith("." + h) for h in _HOSTED):
        quoted = quote(model, safe="")
        asked += [
            _Question("GET", f"{origin}/props", b"", window_from_llamacpp_props, "GET /props n_ctx"),
            _Question(
                "POST",
                f"{origin}/api/show",
                orjson.dumps({"model": model}),
                window_from_ollama_show,
                "POST /api/show num_ctx",
            ),
            _Question(
                "GET",
                f"{origin}/api/v0/models/{quoted}",
                b"",
                lambda d: window_from_models(d, model),
                "GET /api/v0/models",
            ),
        ]
    return asked


# Says who asks: an operator reading the server's log (or a test's fake server) can tell the
# proxy's own questions from the requests it relays for its clients.
PROBE_AGENT = "compaction-proxy window-probe"


class WindowProbe:
    """Asks the upstream for a model's window (see the module's docstring)."""

    def __init__(self, upstream: Upstream, timeout: float = 3.0, version: str = "0") -> None:
        self.upstream = upstream
        self.timeout = timeout
        self.agent = f"{PROBE_AGENT}/{version}".encode()

    async def ask(
        self, base: UpstreamBase, model: str, headers: Sequence[tuple[bytes, bytes]]
    ) -> ProbeAnswer | None:
        sent: Headers = [(n, v) for n, v in headers if n in _CREDENTIALS]
        sent += [(b"accept", b"application/json"), (b"user-agent", self.agent)]
        try:
            async with asyncio.timeout(self.timeout):
                for question in _questions(base, model):
                    window = await self._one(question, sent)
                    if window is not None:
                        return ProbeAnswer(window, question.source)
        except TimeoutError:
            return None
        return None

    async def _one(self, question: _Question, headers: Headers) -> int | None:
        extra = [(b"content-type", b"application/json")] if question.body else []
        try:
            response = await self.upstream.open(question.method, question.url, headers + extra, question.body)
        except Exception:  # a question that fails in any way is "not known"
            return None
        try:
            if response.status_code != 200:
                return None
            body = bytearray()
            async for chunk in response.stream:  # type: ignore[union-attr]
                body += chunk
                if len(body) > MAX_METADATA_BYTES:
                    return None
        except Exception:
            return None
        finally:
            await response.aclose()
        try:
            return question.read(orjson.loads(body))
        except orjson.JSONDecodeError:
            return None
