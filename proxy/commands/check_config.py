"""``compaction-proxy check-config``: a configuration validated, summed up, and one verdict.

By default it prints what decides what the upstream gets (the effective policies and where each
comes from, the ``models`` table against the configured upstreams' usual model names) and ends
with one line: ``OK: <source> is valid: ...``, or ``OK with N warnings: ... Look at: ...`` naming what may
not be what was meant (usual model names left to the default window, an upstream whose model
names are not known here). ``--full`` prints every setting resolved first, as YAML with the
secrets hidden. A configuration that does not load never gets here: the CLI prints its one line
and exits 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import yaml

from proxy.commands.model_coverage import coverage, uncovered_models
from proxy.config.merge import policy_origins
from proxy.config.settings import (
    ENV_ADMIN_TOKEN,
    ENV_ANTHROPIC_API_KEY,
    ENV_ANTHROPIC_URL,
    ENV_CODE_ASSIST_URL,
    ENV_COMPACT_SECRET,
    ENV_CONFIG,
    ENV_GEMINI_API_KEY,
    ENV_GEMINI_URL,
    ENV_HOST,
    ENV_PORT,
    ENV_SUMMARIZER_API_KEY,
    ENV_UPSTREAM_API_KEY,
    ENV_UPSTREAM_URL,
    Settings,
    builtin_policies,
    to_builtins,
)
from proxy.state.learned_windows import LEARNED_WINDOWS_FILE, read_learned
from proxy.upstream.providers import anthropic_base
from proxy.wire.forwarding import UpstreamBase

SECRETS = (
    ("upstream", "api_key"),
    ("anthropic", "api_key"),
    ("gemini", "api_key"),
    ("server", "admin_token"),
    ("compact", "secret"),
)
# What load_settings takes from the environment over the file.
SETTING_VARIABLES = (
    ENV_UPSTREAM_URL,
    ENV_UPSTREAM_API_KEY,
    ENV_ANTHROPIC_URL,
    ENV_ANTHROPIC_API_KEY,
    ENV_GEMINI_URL,
    ENV_GEMINI_API_KEY,
    ENV_CODE_ASSIST_URL,
    ENV_SUMMARIZER_API_KEY,
    ENV_ADMIN_TOKEN,
    ENV_COMPACT_SECRET,
    ENV_HOST,
    ENV_PORT,
)


def run_check(args: argparse.Namespace, settings: Settings) -> int:
    source = args.config or os.environ.get(ENV_CONFIG)
    if args.full:
        sys.stdout.write(resolved_yaml(settings))
    lines = [f"# settings: {source or 'built-in defaults'}{_from_environment()}"]
    lines += policy_lines(settings, source)
    lines.append(hosts_line(settings))
    lines.append("# models table against the configured upstreams' usual model names:")
    learning = settings.upstream.learn_windows
    uncovered = uncovered_models(settings.context_windows, _upstreams(settings), learning)
    lines.extend(f"#   {line}" for line in uncovered)
    lines += learned_lines(settings)
    lines.append(verdict(settings, source))
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def resolved_yaml(settings: Settings) -> str:
    """Every setting resolved, secrets shown only as ``<set>``."""
    resolved = to_builtins(settings)
    for section, secret in SECRETS:
        if resolved[section].get(secret):
            resolved[section][secret] = "<set>"
    return str(yaml.safe_dump(resolved, sort_keys=False))


def policy_lines(settings: Settings, source: str | None) -> list[str]:
    origins = policy_origins(_user_policies(source), builtin_policies())
    width = max(len(name) for name in settings.policies)
    lines = [f"# effective policies (default: {settings.policy}; per request: X-Compaction-Policy):"]
    for name, policy in settings.policies.items():
        stages = ", ".join(next(iter(stage)) for stage in policy.stages) or "no stages"
        lines.append(f"#   {name:<{width}}  {origins.get(name, 'built-in'):<22} {stages}")
    return lines


def learned_lines(settings: Settings) -> list[str]:
    """The windows the providers told a proxy of this configuration (a configured one wins)."""
    path = Path(settings.state_dir) / LEARNED_WINDOWS_FILE
    keys = {
        UpstreamBase(settings.upstream.base_url).key,
        UpstreamBase(anthropic_base(settings.anthropic.base_url)).key,
        UpstreamBase(settings.gemini.base_url).key,
        UpstreamBase(settings.gemini.code_assist_url).key,
    }
    rows = [
        (upstream, model, fields)
        for upstream, models in read_learned(path).items()
        if upstream in keys
        for model, fields in models.items()
        if isinstance(fields, dict) and isinstance(fields.get("window"), int)
    ]
    if not settings.upstream.learn_windows:
        return ["# windows learned from the providers: off (upstream.learn_windows: false)"]
    if not rows:
        return [f"# windows learned from the providers ({path}): none yet"]
    lines = [f"# windows learned from the providers ({path}; a `models:` entry of yours wins):"]
    width = max(len(model) for _, model, _ in rows)
    for upstream, model, fields in rows:
        told = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(fields.get("at", 0.0))))
        source = fields.get("source", "?")
        lines.append(
            f"#   {model:<{width}}  {fields['window']:>9,} tokens  from {source}, {told}, {upstream}"
        )
    return lines


def hosts_line(settings: Settings) -> str:
    """The Host names requests may carry (``server.allowed_hosts``; others get a 421)."""
    server = settings.server
    if "*" in server.allowed_hosts:
        return "# Host names served: any (server.allowed_hosts has *: a balancer in front checks Host)"
    names = ["localhost", "any IP address"]
    if server.host not in ("0.0.0.0", "::", ""):
        names.append(server.host)
    names += server.allowed_hosts
    return f"# Host names served: {', '.join(dict.fromkeys(names))} (others get a 421: server.allowed_hosts)"


def verdict(settings: Settings, source: str | None) -> str:
    """One line: what this configuration does, and what to look at, if anything."""
    policy = settings.policies[settings.policy]
    doing = f"policy {settings.policy} in {settings.mode} mode"
    if not policy.stages:
        doing += " (compacts nothing)"
    elif settings.mode == "shadow":
        doing += " (the upstream gets the original requests)"
    facts = [
        doing,
        f"upstream {settings.upstream.base_url}",
        f"anthropic {settings.anthropic.base_url}",
        f"gemini {settings.gemini.base_url}",
        f"{len(settings.models)} models table entries",
        f"state {settings.state_dir}",
    ]
    look = []
    for host, missing in coverage(settings.context_windows, _upstreams(settings)):
        if missing is None:
            if not settings.upstream.learn_windows:
                look.append(
                    f"{host} serves model names unknown here: give each your agents use a `models:` entry"
                )
        elif missing:
            look.append(f"{len(missing)} usual {host} model names get the default window (see models above)")
    valid = f"{source} is valid" if source else "the built-in defaults are valid"
    if not look:
        return f"OK: {valid}: {'; '.join(facts)}"
    warnings = f"{len(look)} warning{'s' if len(look) > 1 else ''}"
    return f"OK with {warnings}: {valid}: {'; '.join(facts)}. Look at: {'; '.join(look)}"


def _from_environment() -> str:
    """The environment variables that override the file (names only: some hold keys)."""
    names = [name for name in SETTING_VARIABLES if os.environ.get(name)]
    return f", overridden by {', '.join(names)}" if names else ""


def _upstreams(settings: Settings) -> list[str]:
    gemini = settings.gemini
    return [settings.upstream.base_url, settings.anthropic.base_url, gemini.base_url, gemini.code_assist_url]


def _user_policies(source: str | None) -> object:
    if not source:
        return None
    loaded = yaml.safe_load(Path(source).read_text(encoding="utf-8")) or {}
    return loaded.get("policies") if isinstance(loaded, dict) else None
