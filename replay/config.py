"""The replay harness's settings: arms, window, models, prices, and the release gate.

Read from a YAML file (``replay run --replay-config FILE``; every key optional) and validated
before anything starts: a wrong key or type stops the run with a message naming it.
The gate is declared here, before the run (a gate chosen after seeing the results proves nothing).
"""

from __future__ import annotations

import math
import os
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from replay.questions.question import ALL_KINDS
from replay.session.doors import REPLAY_DOORS

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


def _ratio(name: str, value: float) -> None:
    if not math.isfinite(value) or value < 0:
        raise ReplayConfigError(f"{name}: a price ratio is a finite number of at least 0, not {value}")


class ModelPrices(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A model's prices as ratios to its own full input price (``replay.session.cost``)."""

    # A prompt token read from the provider's prompt cache.
    cached_input: float
    # A prompt token written to the cache (Anthropic: 1.25 for the 5-minute TTL; OpenAI: 1).
    cache_write: float = 1.0
    # An output token (answering models' answers and read rounds).
    output: float = 4.0

    def __post_init__(self) -> None:
        for name in ("cached_input", "cache_write", "output"):
            _ratio(name, getattr(self, name))


def _model_prices() -> dict[str, ModelPrices]:
    return {
        "gpt-5*": ModelPrices(cached_input=0.1, output=8.0),
        "gpt-4.1*": ModelPrices(cached_input=0.25),
        "o3*": ModelPrices(cached_input=0.25),
        "o4-mini*": ModelPrices(cached_input=0.25),
        "gpt-4o*": ModelPrices(cached_input=0.5),
        "claude-*": ModelPrices(cached_input=0.1, cache_write=1.25, output=5.0),
        # Gemini 2.5's implicit cache reads at a quarter of the input price, no write premium.
        "gemini-*": ModelPrices(cached_input=0.25, output=8.0),
    }


class Prices(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The price table of the effective cost, in full-price input tokens of the run's model:
    the first ``models`` glob matching ``model`` wins, else the cache rule's provider."""

    openai: ModelPrices = msgspec.field(default_factory=lambda: ModelPrices(cached_input=0.5))
    anthropic: ModelPrices = msgspec.field(
        default_factory=lambda: ModelPrices(cached_input=0.1, cache_write=1.25, output=5.0)
    )
    models: dict[str, ModelPrices] = msgspec.field(default_factory=_model_prices)
    # The summarizer model's input and output tokens (relative to the run model's input).
    summarizer_input: float = 1.0
    summarizer_output: float = 4.0

    def __post_init__(self) -> None:
        _ratio("summarizer_input", self.summarizer_input)
        _ratio("summarizer_output", self.summarizer_output)
        if any(not pattern.strip() for pattern in self.models):
            raise ReplayConfigError("prices.models: a model pattern may not be empty")


class IdleModel(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Simulated time between a session's steps: ``step_seconds`` each (the agent's tool and
    the model's answer), plus ``pause_seconds`` after a share ``pause_share`` of its steps (a
    user reading, a CI wait), the steps chosen by a hash of the case and step, the same for
    every arm. The proxy is told each step's time (``X-Compaction-Clock``)."""

    step_seconds: float = 20.0
    pause_share: float = 0.0
    pause_seconds: float = 900.0

    def __post_init__(self) -> None:
        if self.step_seconds < 0 or self.pause_seconds < 0:
            raise ReplayConfigError("cache.idle: seconds may not be negative")
        if not 0 <= self.pause_share <= 1:
            raise ReplayConfigError("cache.idle.pause_share: between 0 and 1")


class CacheSimulation(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The provider prompt cache simulated per (arm, case) session (``replay.session.cost``)."""

    # openai: longest common prefix with a recent request (1,024 tokens on, 128-token steps);
    # anthropic: up to cache_control breakpoints; none; auto: anthropic for the Messages door,
    # else openai.
    rule: Literal["auto", "openai", "anthropic", "none"] = "auto"
    # A cached prefix lives for the next N requests of its session, and no longer than
    # ttl_seconds of simulated time without use (the idle model below).
    horizon: int = 16
    ttl_seconds: float = 300.0
    # anthropic: the client marks its last message (as Claude Code and the SDKs' agents do).
    client_breakpoint: bool = True
    # The time between a session's requests (the recordings carry no timestamps).
    idle: IdleModel = msgspec.field(default_factory=lambda: IdleModel())
    # false: the proxy is not told the time, so its policies are time-blind (no rewrite timed
    # by the cache); the simulation still bills by it.
    timed: bool = True

    def __post_init__(self) -> None:
        if self.horizon < 1:
            raise ReplayConfigError("cache.horizon: at least 1 request")
        if self.ttl_seconds <= 0:
            raise ReplayConfigError("cache.ttl_seconds: more than 0")


class ReplayConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    arms: tuple[str, ...] = DEFAULT_ARMS
    # enforce: each step is sent in enforce mode: the recorded upstream receives the arm's view,
    # so protocol safety and prefix stability are checked on every request.
    # shadow: steps are sent in shadow mode, as a shadow deployment runs: the upstream gets the
    # original history and the figures come from the proxy's headers and events; only the
    # question-point views (always captured in enforce mode) are checked.
    mode: Literal["enforce", "shadow"] = "enforce"
    # The door the steps go through: chat (POST /v1/chat/completions), responses (POST
    # /v1/responses), anthropic (POST /v1/messages), gemini (POST
    # /v1beta/models/<model>:generateContent) or code_assist (POST /v1internal:generateContent);
    # each case is written in that wire format.
    dialect: str = "chat"
    # Force a context window (tokens) on every request (policies compared at a tight
    # window); null: the proxy's configured window for `model`.
    context_window: int | None = None
    # The model name sent in requests (selects the tokenizer and, unless forced, the window).
    model: str = "gpt-4o"
    # The evidence kinds, then the state-contract kinds (asked where a user turn states such a
    # fact: injected runs, `replay inject`; omitted, at no cost, where none does).
    kinds: tuple[str, ...] = ALL_KINDS
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
    # The effective cost: the simulated prompt cache and the price table (``replay.session.cost``).
    cache: CacheSimulation = msgspec.field(default_factory=CacheSimulation)
    prices: Prices = msgspec.field(default_factory=Prices)
    gate: Gate | None = None

    def __post_init__(self) -> None:
        if not self.arms:
            raise ReplayConfigError("arms: at least one arm is needed")
        if self.concurrency < 1 or self.repeats < 1 or self.max_answer_turns < 1:
            raise ReplayConfigError("concurrency, repeats and max_answer_turns must be at least 1")
        if self.context_window is not None and self.context_window < 1024:
            raise ReplayConfigError("context_window: at least 1024 tokens")
        unknown = set(self.kinds) - set(ALL_KINDS)
        if unknown:
            raise ReplayConfigError(f"kinds: unknown question kinds {sorted(unknown)}")
        doors = [door.dialect for door in REPLAY_DOORS]
        if self.dialect not in doors:
            raise ReplayConfigError(f"dialect: {self.dialect!r} is not a door; doors: {', '.join(doors)}")

    def run_prices(self) -> tuple[str, str, ModelPrices]:
        """The cache rule the run is billed by, the `prices` entry its rates come from, and
        the rates: the first ``prices.models`` glob matching the model, else the rule's
        provider. ("auto": Anthropic's explicit breakpoints for its door; every other
        provider's cache, Gemini's implicit one too, is automatic prefix caching: OpenAI's.)"""
        automatic = "anthropic" if self.provider == "anthropic" else "openai"
        rule: str = automatic if self.cache.rule == "auto" else self.cache.rule
        provider = "anthropic" if rule == "anthropic" else "openai"
        for glob, prices in self.prices.models.items():
            if fnmatchcase(self.model, glob):
                return rule, f"models.{glob}", prices
        return rule, provider, getattr(self.prices, provider)

    @property
    def provider(self) -> str:
        """The provider the door's requests go to (its prompt cache rule, its prices)."""
        return next(door.provider for door in REPLAY_DOORS if door.dialect == self.dialect)


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
