"""Typed settings, loaded once at start-up and validated before anything listens.

Every key has a default here, so the proxy runs with no file at all; ``config.yml`` at the
repository root documents every key and holds exactly these defaults (a test checks it).
A file, the environment and the command line override the defaults, in that order.
An unknown key, a wrong type or a bad value stops the start with a message naming the
file and the key.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import yaml

from policies.builtin_policies import builtin_policy_table
from policies.encodings import CounterBackend
from policies.pipeline import PolicySpec
from policies.tokens import DEFAULT_MODEL_ENCODINGS
from policies.windows import DEFAULT_CONTEXT_WINDOWS
from proxy.canary.gate import CanarySettings
from proxy.config.merge import (
    DEFAULT_MODEL_FACTORS,
    MergeError,
    apply_models,
    builtin_models,
    merge_policies,
)
from proxy.config.sections import SummarizerSettings
from proxy.telemetry.tracing import TracingSettings

EncodingName = Literal["o200k_base", "cl100k_base"]
Mode = Literal["enforce", "shadow", "canary", "off"]

ENV_CONFIG = "COMPACTION_PROXY_CONFIG"
ENV_UPSTREAM_URL = "COMPACTION_PROXY_UPSTREAM_URL"
ENV_UPSTREAM_API_KEY = "COMPACTION_PROXY_UPSTREAM_API_KEY"
ENV_ANTHROPIC_URL = "COMPACTION_PROXY_ANTHROPIC_URL"
ENV_ANTHROPIC_API_KEY = "COMPACTION_PROXY_ANTHROPIC_API_KEY"
ENV_SUMMARIZER_API_KEY = "COMPACTION_PROXY_SUMMARIZER_API_KEY"
ENV_ADMIN_TOKEN = "COMPACTION_PROXY_ADMIN_TOKEN"  # noqa: S105 (a variable name)
ENV_HOST = "COMPACTION_PROXY_HOST"
ENV_PORT = "COMPACTION_PROXY_PORT"

_POLICY_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class ConfigError(ValueError):
    """The configuration cannot be used; the message names the source and the key."""


class _Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    pass


class ServerSettings(_Section, frozen=True):
    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8080
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 64 * 1024 * 1024
    admin_token: str | None = None
    # Clients that present no credential, while upstream.api_key is set, are refused (401)
    # unless this is true: they then all share ONE tenant, so everyone on the network sees
    # everyone's saved outputs and events. (Without upstream.api_key, such clients reach a
    # keyless upstream, e.g. a local model server, as that one shared tenant.)
    allow_anonymous: bool = False
    # The request line and headers together, in bytes; larger ones get a 431 and are closed.
    max_header_bytes: Annotated[int, msgspec.Meta(ge=4096)] = 65536
    # Seconds for a request's headers to arrive (from the connection, or from the first byte of
    # the next request on a kept-alive connection), and the longest wait for the next bytes of
    # its body; past either, a 408 and the connection is closed (slow or stuck clients).
    header_timeout_seconds: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    body_timeout_seconds: Annotated[float, msgspec.Meta(gt=0)] = 60.0
    # Chat bodies over this many bytes, or with more than this many messages, are parsed,
    # counted and compacted in a pool of large_request_workers processes, so that they never
    # hold the event loop (other clients and /healthz stay fast while they are processed).
    large_request_bytes: Annotated[int, msgspec.Meta(ge=65536)] = 8 * 1024 * 1024
    large_request_messages: Annotated[int, msgspec.Meta(ge=10)] = 2000
    large_request_workers: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    # Worker processes. With more than one, metrics use prometheus-client's multiprocess mode
    # and session checkpoints are read from the store on every request (workers share it).
    workers: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    # Seconds between glibc malloc_trim calls that return freed heap pages to the OS (0: never).
    malloc_trim_seconds: Annotated[float, msgspec.Meta(ge=0)] = 1.0


class UpstreamSettings(_Section, frozen=True):
    base_url: str = "https://api.openai.com/v1"
    api_key: str | None = None
    timeout: Annotated[float, msgspec.Meta(gt=0)] = 600.0
    connect_timeout: Annotated[float, msgspec.Meta(gt=0)] = 10.0
    max_connections: Annotated[int, msgspec.Meta(ge=1)] = 512
    max_keepalive_connections: Annotated[int, msgspec.Meta(ge=0)] = 128
    # The wire client under the httpx transport seam: the proxy's own HTTP/1.1 client
    # (``builtin``: httptools' C parser on asyncio, the least CPU), aiohttp's, or httpx's.
    http_client: Literal["builtin", "aiohttp", "httpx"] = "builtin"
    # What the proxy reads of an upstream's answer to its own read_tool_output rounds: a JSON
    # body and one event of a stream at most (past them: a clean 502 upstream_too_large).
    max_response_bytes: Annotated[int, msgspec.Meta(ge=1 << 20)] = 64 << 20
    max_event_bytes: Annotated[int, msgspec.Meta(ge=1 << 16)] = 16 << 20

    def __post_init__(self) -> None:
        if not re.match(r"^https?://[^/\s]+", self.base_url):
            raise ValueError("must be an http:// or https:// URL")
        if "?" in self.base_url or "#" in self.base_url or "\\" in self.base_url:
            raise ValueError("must be a plain URL: no query, fragment or backslash")
        if "@" in self.base_url.split("://", 1)[1].split("/", 1)[0]:
            raise ValueError("must not hold user:password@; set the key with api_key instead")


class AnthropicSettings(_Section, frozen=True):
    # As Anthropic's SDKs take it (no /v1): requests to /v1/messages go to <base_url>/v1/messages.
    base_url: str = "https://api.anthropic.com"
    # Sent as x-api-key for clients that send no credential of their own.
    api_key: str | None = None

    def __post_init__(self) -> None:
        UpstreamSettings(base_url=self.base_url)  # the same URL rules


class ModelSettings(_Section, frozen=True):
    # Context window in tokens, the packaged encoding that counts them, and for models whose
    # tokenizer is not packaged the factor applied to that count (null: the next matching entry's).
    window: Annotated[int, msgspec.Meta(ge=1024)] | None = None
    encoding: EncodingName | None = None
    token_factor: Annotated[float, msgspec.Meta(gt=0.1, le=10)] | None = None
    # US dollars per million tokens: the session page's savings and the canary's cost (null: none).
    input_price: Annotated[float, msgspec.Meta(ge=0)] | None = None
    cached_input_price: Annotated[float, msgspec.Meta(ge=0)] | None = None
    cache_write_price: Annotated[float, msgspec.Meta(ge=0)] | None = None
    output_price: Annotated[float, msgspec.Meta(ge=0)] | None = None


class TokenSettings(_Section, frozen=True):
    default_encoding: EncodingName = "o200k_base"
    model_encodings: dict[str, EncodingName] = msgspec.field(
        default_factory=lambda: dict(DEFAULT_MODEL_ENCODINGS)  # type: ignore[arg-type]
    )
    cache_max_chars: Annotated[int, msgspec.Meta(ge=0)] = 64 * 1024 * 1024
    # What counts: ``auto`` uses rs_bpe (two to three times faster) once it has counted a probe
    # set exactly as tiktoken does, tiktoken otherwise; ``tiktoken`` always uses tiktoken.
    counter: CounterBackend = "auto"
    # Models whose tokenizer is not packaged: the packaged encoding's count times this factor is
    # their count (glob patterns, first match wins). 1.3 is Claude's measured ratio to o200k on
    # code and prose (about 1.15-1.25) with a safety margin.
    model_factors: dict[str, Annotated[float, msgspec.Meta(gt=0.1, le=10)]] = msgspec.field(
        default_factory=lambda: dict(DEFAULT_MODEL_FACTORS)
    )
    # Learn those models' factors from the prompt tokens the upstream reports (per model,
    # bounded, kept in <state_dir>/token_factors.json), so the window is held to the real count.
    calibrate: bool = True


class StoreSettings(_Section, frozen=True):
    backend: Literal["sqlite", "redis"] = "sqlite"
    # With backend redis: the server every replica shares.
    redis_url: str = "redis://127.0.0.1:6379/0"
    # SQLite file (null: <state_dir>/compaction.db).
    path: str | None = None
    keep_days: Annotated[float, msgspec.Meta(gt=0)] = 7.0
    expiry_interval_seconds: Annotated[float, msgspec.Meta(gt=0)] = 3600.0
    # SQLite: how long a statement waits for another process's lock before the request goes
    # on uncompacted (fail open).
    busy_timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=60)] = 1.0
    # SQLite: how long a batch of events waits for more before it is written (one transaction
    # per batch; the events API writes this process's waiting batch before it reads).
    event_batch_seconds: Annotated[float, msgspec.Meta(ge=0, le=5)] = 0.05
    # Redis: how long a command waits to connect or for an answer (retried once) before the
    # request goes on uncompacted; after a failure the store pauses for a second.
    redis_timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=60)] = 0.5


class ReadToolSettings(_Section, frozen=True):
    max_rounds: Annotated[int, msgspec.Meta(ge=0, le=32)] = 4
    max_lines: Annotated[int, msgspec.Meta(ge=1)] = 1000
    # read_tool_output calls answered per model answer; further ones are told to wait.
    max_calls_per_answer: Annotated[int, msgspec.Meta(ge=1, le=128)] = 8
    # Longest line of a read result, in characters (longer ones are clipped with a marker).
    max_line_chars: Annotated[int, msgspec.Meta(ge=80)] = 2000
    # Most bytes and tokens in one read result (also bounded by the room left in the window).
    max_result_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 65536
    max_result_tokens: Annotated[int, msgspec.Meta(ge=100)] = 8000
    # Most bytes of read results per client request, over all rounds.
    max_total_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 262144
    # Seconds a read (pattern search, formatting) may take in its worker thread.
    timeout_seconds: Annotated[float, msgspec.Meta(gt=0)] = 5.0


class ShadowSettings(_Section, frozen=True):
    # Also send a sample of compacted views upstream in the background and compare decisions.
    compare: bool = False
    sample_rate: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.1
    max_concurrent: Annotated[int, msgspec.Meta(ge=1)] = 4


class EventSettings(_Section, frozen=True):
    # Also record a light event for requests on which the policy did nothing.
    record_skipped: bool = False
    # Append every event as a JSON line to this file too (null: the store only).
    jsonl_path: str | None = None


class SessionSettings(_Section, frozen=True):
    # Sessions whose checkpoints are kept in memory; the least recently used go first.
    max_sessions: Annotated[int, msgspec.Meta(ge=1)] = 10_000
    # Each recent conversation's last request is kept (its body, messages, counts and digests)
    # so the next one parses, counts and digests only what it adds; this bounds the tokens
    # they hold (the bodies: 4 bytes a token; 0: off).
    known_prefix_tokens: Annotated[int, msgspec.Meta(ge=0)] = 8 * 1024 * 1024


class LoggingSettings(_Section, frozen=True):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["json", "console"] = "json"


class PinSettings(_Section, frozen=True):
    # Results of these tools (with their calls) are never cleared, offloaded or summarized.
    tools: list[str] = msgspec.field(default_factory=list)
    # Messages whose text matches one of these regular expressions are kept verbatim too.
    patterns: list[str] = msgspec.field(default_factory=list)


class PolicySettings(_Section, frozen=True):
    description: str = ""
    # Ordered stage configurations; their keys are validated by policies.pipeline.
    stages: list[dict[str, Any]] = msgspec.field(default_factory=list)
    # Final token safeguard: the view never exceeds the model's window.
    safeguard: bool = True
    pins: PinSettings = msgspec.field(default_factory=lambda: PinSettings())


def _default_policies() -> dict[str, PolicySettings]:
    return {name: msgspec.convert(spec, PolicySettings) for name, spec in builtin_policy_table().items()}


def _default_windows() -> dict[str, int]:
    return dict(DEFAULT_CONTEXT_WINDOWS)


class Settings(_Section, frozen=True):
    server: ServerSettings = msgspec.field(default_factory=ServerSettings)
    upstream: UpstreamSettings = msgspec.field(default_factory=UpstreamSettings)
    anthropic: AnthropicSettings = msgspec.field(default_factory=AnthropicSettings)
    state_dir: str = "./var"
    mode: Mode = "enforce"
    policy: str = "full"
    policies: dict[str, PolicySettings] = msgspec.field(default_factory=_default_policies)
    # One table per model name pattern; load_settings derives the lookup tables below from it.
    models: dict[str, ModelSettings] = msgspec.field(
        default_factory=lambda: msgspec.convert(builtin_models(), dict[str, ModelSettings])
    )
    # Derived from `models` (a file may still set them: each then replaces its derived table).
    context_windows: dict[str, Annotated[int, msgspec.Meta(ge=1024)]] = msgspec.field(
        default_factory=_default_windows
    )
    summarizer: SummarizerSettings = msgspec.field(default_factory=SummarizerSettings)
    sessions: SessionSettings = msgspec.field(default_factory=SessionSettings)
    store: StoreSettings = msgspec.field(default_factory=StoreSettings)
    read_tool: ReadToolSettings = msgspec.field(default_factory=ReadToolSettings)
    events: EventSettings = msgspec.field(default_factory=EventSettings)
    shadow: ShadowSettings = msgspec.field(default_factory=ShadowSettings)
    tokens: TokenSettings = msgspec.field(default_factory=TokenSettings)
    logging: LoggingSettings = msgspec.field(default_factory=LoggingSettings)
    tracing: TracingSettings = msgspec.field(default_factory=TracingSettings)
    canary: CanarySettings = msgspec.field(default_factory=CanarySettings)

    def __post_init__(self) -> None:
        for name in self.policies:
            if not _POLICY_NAME.match(name):
                raise ValueError(f"policy name {name!r} must match {_POLICY_NAME.pattern}")
        if "default" not in self.context_windows:
            raise ValueError("context_windows needs a `default` entry")
        if self.policy not in self.policies:
            raise ValueError(
                f"`policy: {self.policy}` is not one of the configured policies: {sorted(self.policies)}"
            )


def _set_path(data: dict[str, Any], dotted: str, value: object) -> None:
    node = data
    *parents, leaf = dotted.split(".")
    for key in parents:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[leaf] = value


def _describe_validation_error(exc: msgspec.ValidationError) -> str:
    """msgspec's "Expected X - at `$.a.b`" as "`a.b`: Expected X"."""
    message = str(exc)
    match = re.search(r" - at `\$(?P<path>[^`]*)`$", message)
    path, detail = "", message
    if match:
        path = re.sub(r"\[(['\"])(.*?)\1\]", r".\2", match.group("path")).lstrip(".")
        detail = message[: match.start()]
    unknown = re.match(r"Object contains unknown field `(?P<key>[^`]+)`", detail)
    if unknown:
        key = f"{path}.{unknown.group('key')}" if path else unknown.group("key")
        return f"`{key}`: unknown key"
    return f"`{path or '(top level)'}`: {detail}"


def load_settings(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> Settings:
    """Defaults, then the YAML file (``path`` or ``$COMPACTION_PROXY_CONFIG``), then the
    environment, then ``overrides`` (dotted keys, e.g. ``{"server.port": 9000}``)."""
    env = os.environ if env is None else env
    source = str(path) if path is not None else env.get(ENV_CONFIG) or None
    data: dict[str, Any] = {}
    origin = "built-in defaults"
    if source:
        origin = source
        try:
            text = Path(source).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read configuration file {source}: {exc.strerror or exc}") from exc
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(
                f"{source}: the top level must be a mapping of keys, not {type(loaded).__name__}"
            )
        data = loaded
    for variable, dotted in (
        (ENV_UPSTREAM_URL, "upstream.base_url"),
        (ENV_UPSTREAM_API_KEY, "upstream.api_key"),
        (ENV_ANTHROPIC_URL, "anthropic.base_url"),
        (ENV_ANTHROPIC_API_KEY, "anthropic.api_key"),
        (ENV_ADMIN_TOKEN, "server.admin_token"),
        (ENV_SUMMARIZER_API_KEY, "summarizer.api_key"),
    ):
        if env.get(variable):
            _set_path(data, dotted, env[variable])
    if env.get(ENV_HOST):
        _set_path(data, "server.host", env[ENV_HOST])
    if env.get(ENV_PORT):
        try:
            _set_path(data, "server.port", int(env[ENV_PORT]))
        except ValueError:
            raise ConfigError(f"{ENV_PORT}={env[ENV_PORT]!r}: expected a port number") from None
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_path(data, dotted, value)
    try:
        apply_models(data)
        data["policies"] = merge_policies(data.get("policies"), builtin_policies())
    except MergeError as exc:
        raise ConfigError(f"invalid configuration in {origin}: {exc}") from exc
    # msgspec reports a bad entry of a mapping as `policies[...]`; check entries one by one
    # first so that the message names the policy.
    policies = data.get("policies")
    if isinstance(policies, dict):
        for name, entry in policies.items():
            try:
                msgspec.convert(entry, PolicySettings, strict=True)
            except msgspec.ValidationError as exc:
                detail = _describe_validation_error(exc).replace("`(top level)`", "``")
                inner = re.match(r"^`([^`]*)`(.*)$", detail, re.S)
                if inner:
                    key = f"policies.{name}" + (f".{inner.group(1)}" if inner.group(1) else "")
                    detail = f"`{key}`{inner.group(2)}"
                raise ConfigError(f"invalid configuration in {origin}: {detail}") from exc
    try:
        return msgspec.convert(data, Settings, strict=True)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid configuration in {origin}: {_describe_validation_error(exc)}") from exc


def builtin_policies() -> dict[str, dict[str, Any]]:
    policies: dict[str, dict[str, Any]] = msgspec.to_builtins(_default_policies())
    return policies


def policy_specs(settings: Settings) -> dict[str, PolicySpec]:
    """The policies as ``policies.pipeline.build_policies`` takes them."""
    return {
        name: (p.description, p.stages, p.safeguard, p.pins.tools, p.pins.patterns)
        for name, p in settings.policies.items()
    }


def to_builtins(settings: Settings) -> dict[str, Any]:
    result: dict[str, Any] = msgspec.to_builtins(settings)
    return result
