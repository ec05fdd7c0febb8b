"""The replay harness's settings: arms, window, models, and the release gate.

Read from a YAML file (``replay run --replay-config FILE``; every key optional) and validated
before anything starts: a wrong key or type stops the run with a message naming it.
The gate is declared here, before the run (seed 003: "declare the gate before running").
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

DEFAULT_ARMS = (
    "full",
    "n_latest_10",
    "n_latest_20",
    "n_latest_40",
    "sre",
    "improved_tail",
    "improved_step",
    "improved_offload",
    "improved_retry",
    "improved",
)


class ModelEndpoint(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Any OpenAI-compatible chat endpoint (a hosted API, vLLM, llama.cpp's server)."""

    base_url: str
    model: str
    # Name of the environment variable holding the key (keys never go in files).
    api_key_env: str | None = None
    temperature: float = 0.0
    max_tokens: int = 512
    timeout: float = 300.0

    def api_key(self) -> str:
        if self.api_key_env:
            value = os.environ.get(self.api_key_env)
            if not value:
                raise ReplayConfigError(f"environment variable {self.api_key_env} is not set")
            return value
        return "sk-no-key"


class Gate(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Thresholds a gated arm must meet; a failing gated arm makes the run exit non-zero."""

    # Arms the gate applies to (empty: every arm but `full`).
    arms: tuple[str, ...] = ()
    max_protocol_violations: int = 0
    # Survival (visible + recoverable share) per question kind may fall below the full arm's
    # by at most this much (0.1 = 10 points). Kinds not listed use `default`.
    max_survival_drop: dict[str, float] = msgspec.field(default_factory=lambda: {"default": 0.1})
    # Minimum reduction (1 - tokens after / tokens before over all requests); null: none.
    min_reduction: float | None = None
    # Most summarizer calls, and read_tool_output calls, per case (mean over cases); null: none.
    max_summarizer_calls_per_case: float | None = None
    max_retrieval_calls_per_case: float | None = None
    # With model arms: accuracy may fall below the full arm's by at most this much.
    max_accuracy_drop: float | None = None


class ReplayConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    arms: tuple[str, ...] = DEFAULT_ARMS
    # enforce: each step is sent in enforce mode: the recorded upstream receives the arm's view,
    # so protocol safety and prefix stability are checked on every request.
    # shadow: steps are sent in shadow mode, as a shadow deployment runs: the upstream gets the
    # original history and the figures come from the proxy's headers and events; only the
    # question-point views (always captured in enforce mode) are checked.
    mode: Literal["enforce", "shadow"] = "enforce"
    # The door the steps go through: chat (POST /v1/chat/completions), responses (POST
    # /v1/responses) or anthropic (POST /v1/messages); each case is written in that wire format.
    dialect: Literal["chat", "responses", "anthropic"] = "chat"
    # Force a context window (tokens) on every request (section 4.9); null: the proxy's
    # configured window for `model`.
    context_window: int | None = None
    # The model name sent in requests (selects the tokenizer and, unless forced, the window).
    model: str = "gpt-4o"
    kinds: tuple[str, ...] = ("files_changed", "first_edit", "command_output", "error")
    # Cases replayed at once.
    concurrency: int = 4
    # Model arms: who answers the questions and who judges (null: deterministic metrics only).
    answer_model: ModelEndpoint | None = None
    judge_model: ModelEndpoint | None = None
    # The summarizer the proxy uses for summarizing arms (null: the model-free ledger).
    summarizer_model: ModelEndpoint | None = None
    # Model arms: runs per arm (mean and range), and the full arm answered twice (A/A').
    repeats: int = 3
    noise_floor: bool = True
    # Most turns an answer may take (tool calls answered with the sandbox-shutdown reply).
    max_answer_turns: int = 4
    gate: Gate | None = None

    def __post_init__(self) -> None:
        if not self.arms:
            raise ReplayConfigError("arms: at least one arm is needed")
        if self.concurrency < 1 or self.repeats < 1 or self.max_answer_turns < 1:
            raise ReplayConfigError("concurrency, repeats and max_answer_turns must be at least 1")
        if self.context_window is not None and self.context_window < 1024:
            raise ReplayConfigError("context_window: at least 1024 tokens")
        unknown = set(self.kinds) - {"files_changed", "first_edit", "command_output", "error"}
        if unknown:
            raise ReplayConfigError(f"kinds: unknown question kinds {sorted(unknown)}")


class ReplayConfigError(ValueError):
    pass


def load_replay_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> ReplayConfig:
    raw: dict[str, Any] = {}
    if path is not None:
        loaded = yaml.safe_load(Path(path).read_text())
        if loaded is not None and not isinstance(loaded, dict):
            raise ReplayConfigError(f"{path}: expected a mapping at the top level")
        raw = dict(loaded or {})
    for key, value in (overrides or {}).items():
        if value is not None:
            raw[key] = value
    try:
        return msgspec.convert(raw, ReplayConfig)
    except msgspec.ValidationError as error:
        raise ReplayConfigError(f"{path or 'replay settings'}: {error}") from None


def config_builtins(config: ReplayConfig) -> dict[str, Any]:
    result: dict[str, Any] = msgspec.to_builtins(config)
    return result
