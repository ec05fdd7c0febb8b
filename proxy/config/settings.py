"""Typed settings, loaded once at start-up and validated before anything listens.

Every key has a default here, so the proxy runs with no file at all; ``config.yml`` at the
repository root documents every key and holds exactly these defaults (a test checks it).
A file, the environment and the command line override the defaults, in that order.
An unknown key, a wrong type or a bad value stops the start with a message naming the
file and the key.
"""

from __future__ import annotations

import hashlib
import os
import re
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import msgspec
import orjson
import yaml

from policies.builtin_policies import builtin_policy_table
from policies.pipeline import PolicySpec
from policies.windows import DEFAULT_CONTEXT_WINDOWS
from proxy.config.merge import (
    MergeError,
    apply_models,
    builtin_models,
    merge_policies,
)
from proxy.config.prompt_cache import PromptCacheSettings
from proxy.config.sections import (
    AnthropicSettings,
    CanarySettings,
    CompactSettings,
    EventSettings,
    GeminiSettings,
    LoggingSettings,
    Mode,
    ModelSettings,
    PolicySettings,
    ReadToolSettings,
    Section,
    ServerSettings,
    SessionSettings,
    ShadowSettings,
    StoreSettings,
    SummarizerSettings,
    TokenSettings,
    TracingSettings,
    UpstreamSettings,
)

ENV_CONFIG = "COMPACTION_PROXY_CONFIG"
ENV_UPSTREAM_URL = "COMPACTION_PROXY_UPSTREAM_URL"
ENV_UPSTREAM_API_KEY = "COMPACTION_PROXY_UPSTREAM_API_KEY"
ENV_ANTHROPIC_URL = "COMPACTION_PROXY_ANTHROPIC_URL"
ENV_ANTHROPIC_API_KEY = "COMPACTION_PROXY_ANTHROPIC_API_KEY"
ENV_GEMINI_URL = "COMPACTION_PROXY_GEMINI_URL"
ENV_GEMINI_API_KEY = "COMPACTION_PROXY_GEMINI_API_KEY"
ENV_CODE_ASSIST_URL = "COMPACTION_PROXY_CODE_ASSIST_URL"
ENV_SUMMARIZER_API_KEY = "COMPACTION_PROXY_SUMMARIZER_API_KEY"
ENV_ADMIN_TOKEN = "COMPACTION_PROXY_ADMIN_TOKEN"  # noqa: S105 (a variable name)
ENV_COMPACT_SECRET = "COMPACTION_PROXY_COMPACT_SECRET"  # noqa: S105 (a variable name)
ENV_HOST = "COMPACTION_PROXY_HOST"
ENV_PORT = "COMPACTION_PROXY_PORT"

_POLICY_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class ConfigError(ValueError):
    """The configuration cannot be used; the message names the source and the key."""


def _default_policies() -> dict[str, PolicySettings]:
    return {name: msgspec.convert(spec, PolicySettings) for name, spec in builtin_policy_table().items()}


def _default_windows() -> dict[str, int]:
    return dict(DEFAULT_CONTEXT_WINDOWS)


class Settings(Section, frozen=True):
    server: ServerSettings = msgspec.field(default_factory=ServerSettings)
    upstream: UpstreamSettings = msgspec.field(default_factory=UpstreamSettings)
    anthropic: AnthropicSettings = msgspec.field(default_factory=AnthropicSettings)
    gemini: GeminiSettings = msgspec.field(default_factory=GeminiSettings)
    state_dir: str = "./var"
    mode: Mode = "enforce"
    policy: str = "improved"
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
    prompt_cache: PromptCacheSettings = msgspec.field(default_factory=PromptCacheSettings)
    compact: CompactSettings = msgspec.field(default_factory=CompactSettings)

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
        (ENV_GEMINI_URL, "gemini.base_url"),
        (ENV_GEMINI_API_KEY, "gemini.api_key"),
        (ENV_CODE_ASSIST_URL, "gemini.code_assist_url"),
        (ENV_ADMIN_TOKEN, "server.admin_token"),
        (ENV_SUMMARIZER_API_KEY, "summarizer.api_key"),
        (ENV_COMPACT_SECRET, "compact.secret"),
    ):
        if env.get(variable):
            _set_path(data, dotted, env[variable])
            # Named in a message about the configuration (names only: some hold keys).
            origin += f"{' and' if ' with ' in origin else ' with'} {variable}"
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


# Where a proxy listens (and the Host names it answers to) is not how it compacts: a proxy
# started for a run on a free port, or with --port, still runs the same configuration.
_NOT_DIGESTED = (("server", "host"), ("server", "port"), ("server", "allowed_hosts"))
_SECRETS = (
    ("upstream", "api_key"),
    ("anthropic", "api_key"),
    ("gemini", "api_key"),
    ("summarizer", "api_key"),
    ("server", "admin_token"),
    ("compact", "secret"),
)


def settings_digest(settings: Settings) -> str:
    """A short digest of the resolved settings that identifies a configuration without
    revealing any secret: a key or token counts only as set or not, the tracing headers only by
    their names, a Redis URL without its user and password. Two proxies with
    equal digests compact alike (the listen address is left out)."""
    resolved = to_builtins(settings)
    for section, key in _NOT_DIGESTED:
        resolved[section].pop(key, None)
    for section, key in _SECRETS:
        resolved[section][key] = bool(resolved[section].get(key))
    resolved["tracing"]["headers"] = sorted(resolved["tracing"]["headers"])
    redis = urllib.parse.urlsplit(resolved["store"]["redis_url"])
    resolved["store"]["redis_url"] = redis._replace(netloc=redis.netloc.rpartition("@")[2]).geturl()
    text = orjson.dumps(resolved, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(text, digest_size=8).hexdigest()
