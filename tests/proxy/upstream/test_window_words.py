"""The providers' own words about a model's window: every refusal and metadata shape known."""

from __future__ import annotations

import orjson
import pytest

from proxy.upstream.window_words import (
    Refusal,
    context_refusal,
    window_from_llamacpp_props,
    window_from_models,
    window_from_ollama_show,
)
from tests.agent_upstream.protocol import refusal_body


def openai_shaped(message: str, **extra: object) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": "invalid_request_error", **extra}})


REFUSALS = {
    "openai": (
        openai_shaped(
            "This model's maximum context length is 8192 tokens. However, your messages resulted in "
            "9120 tokens. Please reduce the length of the messages.",
            code="context_length_exceeded",
        ),
        Refusal(8192, 9120),
    ),
    "openrouter": (
        openai_shaped(
            "This endpoint's maximum context length is 32768 tokens. However, you requested about "
            "40021 tokens (39021 of text input, 1000 in the output). Please reduce the length."
        ),
        Refusal(32768, 40021),
    ),
    "vllm-old": (
        openai_shaped(
            "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens "
            "(8000 in the messages, 1000 in the completion). Please reduce the length of the messages "
            "or completion."
        ),
        Refusal(8192, 9000),
    ),
    "vllm-new": (
        openai_shaped(
            "'max_tokens' or 'max_completion_tokens' is too large: 1000. This model's maximum context "
            "length is 4096 tokens and your request has 3778 input tokens (1000 > 4096 - 3778). None"
        ),
        Refusal(4096, 3778),
    ),
    "vllm-decoder": (
        openai_shaped(
            "The decoder prompt (length 9001) is longer than the maximum model length of 8192. Make "
            "sure that `max_model_len` is no smaller than the number of text tokens."
        ),
        Refusal(8192, 9001),
    ),
    "llama.cpp": (
        orjson.dumps(
            {
                "error": {
                    "code": 400,
                    "message": "request (4476 tokens) exceeds the available context size (4096 tokens)",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": 4476,
                    "n_ctx": 4096,
                }
            }
        ),
        Refusal(4096, 4476),
    ),
    "lm-studio": (
        openai_shaped(
            "Trying to keep the first 10136 tokens when context the overflows. However, the model is "
            "loaded with context length of only 7866 tokens, which is not enough. Try to load the "
            "model with a larger context length, or provide a shorter input"
        ),
        Refusal(7866, 10136),
    ),
    "lm-studio-n-keep": (
        openai_shaped(
            "The number of tokens to keep from the initial prompt is greater than the context length "
            "(n_keep: 10247 >= n_ctx: 4096). Try to load the model with a larger context length."
        ),
        Refusal(4096, 10247),
    ),
    "ollama": (
        orjson.dumps(
            {
                "error": {
                    "message": "input (9000 tokens) is longer than the model's context length (8192 tokens)",
                    "type": "api_error",
                }
            }
        ),
        Refusal(8192, 9000),
    ),
    "anthropic": (
        orjson.dumps(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "prompt is too long: 210000 tokens > 200000 maximum",
                },
            }
        ),
        Refusal(200000, 210000),
    ),
    "anthropic-max-tokens": (
        orjson.dumps(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "input length and `max_tokens` exceed context limit: 195000 + 10000 > "
                    "200000, decrease input length or `max_tokens` and try again",
                },
            }
        ),
        Refusal(200000, 195000),
    ),
    "gemini": (
        openai_shaped(
            "The input token count (1196265) exceeds the maximum number of tokens allowed (1048575)."
        ),
        Refusal(1048575, 1196265),
    ),
    "mistral": (
        openai_shaped(
            "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 "
            "maximum context length"
        ),
        Refusal(32768, 40000),
    ),
    "plain-text": (b"This model's maximum context length is 16,385 tokens.", Refusal(16385, None)),
}


@pytest.mark.parametrize("provider", sorted(REFUSALS))
def test_every_known_refusal_names_its_window(provider: str) -> None:
    body, expected = REFUSALS[provider]
    assert context_refusal(400, body) == expected


@pytest.mark.parametrize("flavor", ["openai", "vllm", "llamacpp", "ollama", "lmstudio", "anthropic"])
def test_the_fakes_refusals_are_learned(flavor: str) -> None:
    """The test upstreams answer in each provider's words; every one is understood."""
    assert context_refusal(400, orjson.dumps(refusal_body(flavor, 8192, 9000))) == Refusal(8192, 9000)


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (
            400,
            openai_shaped("Your input exceeds the context window of this model. Please adjust your input."),
        ),
        (400, openai_shaped("Invalid value for 'temperature'.")),
        (429, openai_shaped("This model's maximum context length is 8192 tokens.")),
        (400, openai_shaped("This model's maximum context length is 12 tokens.")),  # not a window
        (400, b""),
        (400, b"x" * 70_000),
    ],
)
def test_what_is_not_a_refusal_with_a_window_teaches_nothing(status: int, body: bytes) -> None:
    assert context_refusal(status, body) is None


def test_models_listings_of_each_server() -> None:
    vllm = {"object": "list", "data": [{"id": "qwen", "object": "model", "max_model_len": 8192}]}
    openrouter = {
        "data": [{"id": "a/b", "context_length": 131072, "top_provider": {"context_length": 65536}}]
    }
    lm_studio = {"id": "phi", "max_context_length": 131072, "loaded_context_length": 8192}
    nested = {"data": [{"id": "x", "top_provider": {"context_length": 65536}}]}
    assert window_from_models(vllm, "qwen") == 8192
    assert window_from_models(vllm, "other") is None
    assert window_from_models(openrouter, "a/b") == 131072
    assert window_from_models(lm_studio, "phi") == 8192  # what it is loaded with, not its limit
    assert window_from_models(nested, "x") == 65536
    assert window_from_models({"data": [{"id": "gpt-4o", "object": "model"}]}, "gpt-4o") is None


def test_llamacpp_props_and_ollama_show() -> None:
    assert (
        window_from_llamacpp_props({"default_generation_settings": {"n_ctx": 8192}, "total_slots": 1}) == 8192
    )
    assert window_from_llamacpp_props({"n_ctx": 4096}) == 4096
    assert window_from_llamacpp_props({"choices": []}) is None
    info = {"model_info": {"llama.context_length": 131072}, "details": {"family": "llama"}}
    assert window_from_ollama_show({**info, "parameters": 'stop "<|eot|>"\nnum_ctx 8192'}) == 8192
    assert window_from_ollama_show(info) == 4096  # Ollama's default context, under the trained one
    assert window_from_ollama_show({"model_info": {"x.context_length": 2048}, "details": {}}) == 2048
    assert window_from_ollama_show({"id": "c", "choices": []}) is None  # not Ollama's answer


def test_every_fake_providers_own_refusal_is_read_as_the_provider_means_it() -> None:
    """The Anthropic fake's two real wordings name the window; the Responses API's real one names
    none (``Your input exceeds the context window of this model``): that teaches nothing and is
    relayed as it came."""
    from tests.anthropic_upstream.errors import error_body, prompt_too_long
    from tests.responses_upstream import context_length_error

    over = orjson.dumps(error_body(400, prompt_too_long(9000, 100, 8192)))
    with_answer = orjson.dumps(error_body(400, prompt_too_long(8100, 500, 8192)))
    assert context_refusal(400, over) == Refusal(8192, 9000)
    assert context_refusal(400, with_answer) == Refusal(8192, 8100)
    assert context_refusal(400, orjson.dumps(context_length_error())) is None
