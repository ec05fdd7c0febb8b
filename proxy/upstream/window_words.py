"""What a provider says about a model's context window, read from its own words (sans-I/O).

Two sources, both the provider's, never a guess:

- its refusal of a request over the window (``context_refusal``): OpenAI's and OpenRouter's
  ``maximum context length is N tokens``, Anthropic's ``prompt is too long: N tokens > M
  maximum``, vLLM's, llama.cpp's (``n_ctx`` in the body), Ollama's, LM Studio's, Gemini's and
  Mistral's wordings. A refusal that names no number (``Your input exceeds the context window
  of this model``) teaches nothing: the proxy cannot know how far to compact.
- its metadata (``window_from_*``): ``/v1/models`` entries (vLLM ``max_model_len``, OpenRouter
  ``context_length``, LM Studio ``loaded_context_length``/``max_context_length``), llama.cpp's
  ``/props`` (``n_ctx``, per slot), Ollama's ``/api/show`` (the ``num_ctx`` it runs the model
  with, else Ollama's default of 4096, never more than the model's trained length).

The rule for a number: a window is at least 256 and at most 100M tokens; anything else is not a
window and is ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

# Statuses a context refusal comes with: 400 (OpenAI, Anthropic, vLLM, llama.cpp, LM Studio),
# 413 (a gateway's "request too large"), 422 (some OpenAI-compatible servers), 500 (older
# llama.cpp and Ollama builds).
REFUSAL_STATUSES = frozenset({400, 413, 422, 500})
# The most of a refusal's body read: real ones are a few hundred bytes.
MAX_REFUSAL_BYTES = 65536
_MIN_WINDOW, _MAX_WINDOW = 256, 100_000_000
# Ollama's context when the model's parameters set no num_ctx (its default since 0.6).
OLLAMA_DEFAULT_NUM_CTX = 4096

_N = r"(\d[\d,_]*)"
# (pattern, group of the window, group of the prompt's tokens or 0), most specific first.
_REFUSALS: tuple[tuple[re.Pattern[str], int, int], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), window, prompt)
    for pattern, window, prompt in (
        # Anthropic.
        (rf"prompt is too long: {_N} tokens > {_N} maximum", 2, 1),
        (rf"exceed context limit: {_N} \+ {_N} > {_N}", 3, 1),
        # llama.cpp (newer builds also put n_ctx and n_prompt_tokens in the body).
        (rf"request \({_N} tokens\) exceeds the available context size \({_N} tokens\)", 2, 1),
        # LM Studio.
        (rf"keep the first {_N} tokens when context the overflows.*?context length of only {_N}", 2, 1),
        (rf"n_keep: {_N} >= n_ctx: {_N}", 2, 1),
        # Ollama.
        (rf"input \({_N} tokens\) is longer than the model'?s context length \({_N} tokens\)", 2, 1),
        # vLLM: the prompt alone, then prompt plus max_tokens (older and newer wordings).
        (rf"decoder prompt \(length {_N}\) is longer than the maximum model length of {_N}", 2, 1),
        (rf"input prompt \({_N} tokens\) is too long and exceeds limit of {_N}", 2, 1),
        (rf"maximum context length is {_N} tokens and your request has {_N} input tokens", 1, 2),
        # OpenAI, OpenRouter, vLLM, Groq, DeepSeek, Together...
        (
            rf"maximum context length is {_N} tokens\. However, (?:your messages resulted in|you "
            rf"requested(?: about)?) {_N} tokens",
            1,
            2,
        ),
        (rf"maximum context length (?:is|of) {_N}", 1, 0),
        # Gemini's OpenAI-compatible endpoint, Mistral, others.
        (rf"input token count \({_N}\) exceeds the maximum number of tokens allowed \({_N}\)", 2, 1),
        (rf"prompt contains {_N} tokens.*?too large for model with {_N} maximum context length", 2, 1),
        (rf"prompt has {_N} tokens, but the configured context size is {_N} tokens", 2, 1),
    )
)


@dataclass(frozen=True, slots=True)
class Refusal:
    """A provider's refusal of a request over the model's window: the window it gave, and how
    many tokens it counted in the prompt where it said (None: not said)."""

    window: int
    prompt_tokens: int | None = None


def _number(text: str) -> int:
    return int(text.replace(",", "").replace("_", ""))


def _window(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    window = int(value)
    return window if _MIN_WINDOW <= window <= _MAX_WINDOW else None


def _message(data: Any) -> str | None:
    """The error's words in a provider's JSON body (OpenAI, Anthropic, Ollama shapes)."""
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    if isinstance(error, str):
        return error
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        return str(data["message"])
    return None


def context_refusal(status: int, body: bytes) -> Refusal | None:
    """The window a provider's error answer names, if it is a context-length refusal."""
    if status not in REFUSAL_STATUSES or not body or len(body) > MAX_REFUSAL_BYTES:
        return None
    try:
        data: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        # llama.cpp says it in fields too: trust them over the words.
        window = _window(error.get("n_ctx"))
        if window is not None and error.get("type") == "exceed_context_size_error":
            prompt = error.get("n_prompt_tokens")
            return Refusal(window, prompt if isinstance(prompt, int) and prompt > 0 else None)
    text = _message(data) if data is not None else body.decode("utf-8", "replace")
    if not text:
        return None
    for pattern, window_group, prompt_group in _REFUSALS:
        found = pattern.search(text)
        if found is None:
            continue
        window = _window(_number(found.group(window_group)))
        if window is None:
            return None
        prompt = _number(found.group(prompt_group)) if prompt_group else None
        return Refusal(window, prompt if prompt else None)
    return None


# --- metadata ----------------------------------------------------------------------------------

# /v1/models entry fields, most specific first: what the model is loaded with, then its limit.
_MODEL_FIELDS = (
    "loaded_context_length",
    "max_model_len",
    "context_length",
    "max_context_length",
    "context_window",
    "max_input_tokens",
)


def window_from_models(data: Any, model: str) -> int | None:
    """The window a ``/v1/models`` listing (or one model's entry) gives ``model``."""
    entries = data.get("data") if isinstance(data, dict) and "data" in data else data
    if isinstance(entries, dict):
        entries = [entries]
    if not isinstance(entries, list):
        return None
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("id") != model:
            continue
        for field in _MODEL_FIELDS:
            window = _window(entry.get(field))
            if window is not None:
                return window
        top = entry.get("top_provider")  # OpenRouter: the provider that serves it
        if isinstance(top, dict):
            return _window(top.get("context_length"))
    return None


def window_from_llamacpp_props(data: Any) -> int | None:
    """llama.cpp ``/props``: the context of one slot (``--ctx-size`` over ``--parallel``)."""
    if not isinstance(data, dict):
        return None
    settings = data.get("default_generation_settings")
    if isinstance(settings, dict):
        window = _window(settings.get("n_ctx"))
        if window is not None:
            return window
    return _window(data.get("n_ctx"))


_NUM_CTX = re.compile(r"^\s*num_ctx\s+(\d+)\s*$", re.MULTILINE)


def window_from_ollama_show(data: Any) -> int | None:
    """Ollama ``/api/show``: the ``num_ctx`` the model runs with (its Modelfile's parameter),
    else Ollama's default context, never more than the model's trained length. Ollama's
    OpenAI-compatible endpoint silently drops the start of a longer prompt: compacting below
    this window is what keeps the task and the latest steps."""
    if not isinstance(data, dict) or not any(k in data for k in ("model_info", "modelfile", "details")):
        return None  # not Ollama's answer
    trained = None
    info = data.get("model_info")
    if isinstance(info, dict):
        trained = next(
            (_window(v) for k, v in info.items() if isinstance(k, str) and k.endswith(".context_length")),
            None,
        )
    parameters = data.get("parameters")
    found = _NUM_CTX.search(parameters) if isinstance(parameters, str) else None
    window = _window(int(found.group(1))) if found else OLLAMA_DEFAULT_NUM_CTX
    if window is None:
        return trained
    return min(window, trained) if trained is not None else window
