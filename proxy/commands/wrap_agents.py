"""How ``wrap`` points each agent at the proxy: the agent's own way to a custom base URL, the
user's own files untouched (environment variables, flags, or configuration given inline).

Every agent is pointed at the run's session path, ``http://127.0.0.1:PORT/s/<session>``: the
proxy strips that prefix and takes the session as an ``X-Session-Id`` (a client's own header
wins), so a client that cannot send a header still lands in the run's session.

To add an agent: a function below that returns its environment and command line, and its row
in ``AGENTS``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

Wiring = tuple[dict[str, str], list[str]]


def session_root(base: str, session: str) -> str:
    """The base URL that carries the run's session: Anthropic-style clients append
    ``/v1/messages`` to it, OpenAI-style ones are given it with ``/v1``."""
    return f"{base}/s/{session}"


def _sdk_variables(root: str) -> dict[str, str]:
    """The variables OpenAI's and Anthropic's SDKs and LiteLLM read."""
    return {
        "OPENAI_BASE_URL": f"{root}/v1",
        "OPENAI_API_BASE": f"{root}/v1",
        "ANTHROPIC_BASE_URL": root,
        "ANTHROPIC_API_BASE": root,
    }


def _claude(agent: str, args: Sequence[str], root: str, env: Mapping[str, str]) -> Wiring:
    # Claude Code reads the Anthropic base URL without /v1.
    return {"ANTHROPIC_BASE_URL": root}, [agent, *args]


def _codex(agent: str, args: Sequence[str], root: str, env: Mapping[str, str]) -> Wiring:
    # Codex reads its provider from its configuration: one of its own for the run, given on
    # the command line (-c), the user's config.toml untouched.
    provider = (
        f'{{name="compaction-proxy", base_url="{root}/v1", wire_api="responses", env_key="OPENAI_API_KEY"}}'
    )
    command = [agent, "-c", 'model_provider="compaction-proxy"']
    return {}, [*command, "-c", f"model_providers.compaction-proxy={provider}", *args]


def _opencode(agent: str, args: Sequence[str], root: str, env: Mapping[str, str]) -> Wiring:
    # OPENCODE_CONFIG_CONTENT is opencode's inline configuration, merged over every file and
    # applied last; the user's own inline configuration is kept, with the base URLs replaced.
    try:
        inline = json.loads(env.get("OPENCODE_CONFIG_CONTENT") or "{}")
    except ValueError:
        inline = {}
    if not isinstance(inline, dict):
        inline = {}
    providers = inline.setdefault("provider", {})
    for name in ("openai", "anthropic"):
        # @ai-sdk/anthropic's base URL ends in /v1 as OpenAI's does.
        entry = providers.setdefault(name, {})
        entry.setdefault("options", {})["baseURL"] = f"{root}/v1"
    return {"OPENCODE_CONFIG_CONTENT": json.dumps(inline)}, [agent, *args]


def _aider(agent: str, args: Sequence[str], root: str, env: Mapping[str, str]) -> Wiring:
    # aider's AIDER_* variables beat its .aider.conf.yml; it hands the base to LiteLLM.
    variables = _sdk_variables(root)
    variables["AIDER_OPENAI_API_BASE"] = f"{root}/v1"
    return variables, [agent, *args]


def _qwen(agent: str, args: Sequence[str], root: str, env: Mapping[str, str]) -> Wiring:
    # Qwen Code's OpenAI mode reads OPENAI_BASE_URL (its settings.json may name another: the
    # flag, which beats both, is given too).
    return _sdk_variables(root), [agent, "--openai-base-url", f"{root}/v1", *args]


def _goose(agent: str, args: Sequence[str], root: str, env: Mapping[str, str]) -> Wiring:
    # goose reads a provider's settings from the environment before its config.yaml: its
    # OpenAI provider joins OPENAI_HOST and OPENAI_BASE_PATH, its Anthropic one appends
    # v1/messages to ANTHROPIC_HOST. The provider itself stays the user's choice.
    base, _, path = root.partition("/s/")
    return {
        "OPENAI_HOST": base,
        "OPENAI_BASE_PATH": f"s/{path}/v1/chat/completions",
        "ANTHROPIC_HOST": root,
    }, [agent, *args]


def _gemini(agent: str, args: Sequence[str], root: str, env: Mapping[str, str]) -> Wiring:
    # Gemini CLI: its Gemini API client appends /v1beta/... to GOOGLE_GEMINI_BASE_URL, its Code
    # Assist client (a Google login) /v1internal:... to CODE_ASSIST_ENDPOINT. With an API key,
    # 0.61.0 also needs `security.auth.selectedType: gemini-api-key` in its settings.json (left
    # to the user: wrap writes none of their files).
    return {"GOOGLE_GEMINI_BASE_URL": root, "CODE_ASSIST_ENDPOINT": root}, [agent, *args]


def _any(agent: str, args: Sequence[str], root: str, env: Mapping[str, str]) -> Wiring:
    return _sdk_variables(root), [agent, *args]


Wire = Callable[[str, Sequence[str], str, Mapping[str, str]], Wiring]

# The agents wrap knows by name (the command's base name); any other command gets the SDKs'
# variables.
AGENTS: dict[str, Wire] = {
    "claude": _claude,
    "codex": _codex,
    "gemini": _gemini,
    "opencode": _opencode,
    "aider": _aider,
    "qwen": _qwen,
    "goose": _goose,
}


def agent_wiring(
    agent: str, args: Sequence[str], base: str, session: str, env: Mapping[str, str]
) -> tuple[dict[str, str], list[str]]:
    """The agent's environment and command line with the proxy at ``base``
    (``http://host:port``) as its API, in the run's session. Keys stay as the user set them:
    the proxy passes each to the provider its client addressed."""
    wire = AGENTS.get(Path(agent).name, _any)
    variables, command = wire(agent, args, session_root(base, session), env)
    environment = {**env, **variables, "COMPACTION_PROXY_SESSION": session}
    return environment, command
