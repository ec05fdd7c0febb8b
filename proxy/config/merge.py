"""What a settings file adds to the built-ins, before the result is validated.

- ``policies:`` merge with the built-in policies by name: a new name adds a policy, a built-in
  name replaces that one, the other built-ins stay. A policy may ``extends: <name>`` and list
  only what differs: ``overrides: {<stage>: {<knob>: value}}`` changes knobs of that stage
  (``<stage>: null`` removes it), and ``description``, ``stages``, ``safeguard``, ``pins`` replace
  the parent's when given.
- ``models:`` is one table per model name pattern (glob, first match wins) of ``window``,
  ``encoding`` and ``token_factor``; a user's entries merge with the built-in ones by pattern
  (fields given replace the built-in's), new patterns go first. A model takes each field from
  the first matching entry that sets it, else from ``default``.
- The older separate tables (``context_windows``, ``tokens.model_encodings``,
  ``tokens.model_factors``, ``tokens.default_encoding``) still work: when a file sets one, that
  table replaces the one derived from ``models`` entirely, as it always did.

Everything here works on plain data (what YAML gave); errors name the key they are about.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from policies.tokens import DEFAULT_MODEL_ENCODINGS
from policies.windows import DEFAULT_CONTEXT_WINDOWS


class MergeError(ValueError):
    """A merge cannot be done; the message names the key."""


# --- models -------------------------------------------------------------------------------------

DEFAULT_MODEL_FACTORS: dict[str, float] = {"claude-*": 1.3, "gemini-*": 1.2}
DEFAULT_ENCODING = "o200k_base"


def builtin_models() -> dict[str, dict[str, Any]]:
    """The built-in windows, encodings and token factors as one table, in an order where every
    field resolves exactly as it did in its own table."""
    order = [
        "gpt-4o*",
        "gpt-4.1*",
        "gpt-4.5*",
        "gpt-5*",
        "chatgpt-4o*",
        "o1*",
        "o3*",
        "o4*",
        "codex-mini*",
        "gpt-4-turbo*",
        "gpt-4*",
        "gpt-3.5-turbo*",
        "gpt-3.5*",
        "text-embedding-3*",
        "text-embedding-ada-002",
        "claude-*",
        "gemini-*",
    ]
    known = set(DEFAULT_CONTEXT_WINDOWS) | set(DEFAULT_MODEL_ENCODINGS) | set(DEFAULT_MODEL_FACTORS)
    missing = known - set(order) - {"default"}
    if missing:  # a pattern added to a built-in table must get a place here
        raise RuntimeError(f"built-in model patterns without a place in the table: {sorted(missing)}")
    table: dict[str, dict[str, Any]] = {}
    for pattern in order:
        entry: dict[str, Any] = {}
        if pattern in DEFAULT_CONTEXT_WINDOWS:
            entry["window"] = DEFAULT_CONTEXT_WINDOWS[pattern]
        if pattern in DEFAULT_MODEL_ENCODINGS:
            entry["encoding"] = DEFAULT_MODEL_ENCODINGS[pattern]
        if pattern in DEFAULT_MODEL_FACTORS:
            entry["token_factor"] = DEFAULT_MODEL_FACTORS[pattern]
        table[pattern] = entry
    table["default"] = {"window": DEFAULT_CONTEXT_WINDOWS["default"], "encoding": DEFAULT_ENCODING}
    return table


_MODEL_FIELDS = (
    "window",
    "encoding",
    "token_factor",
    "input_price",
    "cached_input_price",
    "cache_write_price",
    "output_price",
)


def merge_models(user: object) -> dict[str, dict[str, Any]]:
    builtin = builtin_models()
    if user is None:
        return builtin
    if not isinstance(user, Mapping):
        raise MergeError("`models`: expected a mapping of model name patterns")
    added: dict[str, dict[str, Any]] = {}
    for pattern, fields in user.items():
        if not isinstance(fields, Mapping):
            raise MergeError(f"`models.{pattern}`: expected a mapping of {', '.join(_MODEL_FIELDS)}")
        unknown = set(fields) - set(_MODEL_FIELDS)
        if unknown:
            raise MergeError(f"`models.{pattern}.{sorted(unknown)[0]}`: unknown key")
        given = {k: v for k, v in fields.items() if v is not None}
        if pattern in builtin:
            builtin[pattern] = {**builtin[pattern], **given}
        else:
            added[str(pattern)] = dict(given)
    default = builtin["default"]
    for field in ("window", "encoding"):
        if field not in default:
            raise MergeError(f"`models.default.{field}`: the default entry needs a {field}")
    return {**added, **builtin}


def derived_tables(models: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The per-field tables the proxy looks models up in."""

    def column(field: str) -> dict[str, Any]:
        return {p: e[field] for p, e in models.items() if p != "default" and e.get(field) is not None}

    return {
        "context_windows": {**column("window"), "default": models["default"]["window"]},
        "model_encodings": column("encoding"),
        "model_factors": column("token_factor"),
        "default_encoding": models["default"]["encoding"],
    }


def configured_window_patterns(context_windows: Mapping[str, int]) -> tuple[str, ...]:
    """The model patterns whose window your configuration sets (not the built-in table's): a
    window the provider tells the proxy never replaces one of these."""
    builtin = derived_tables(builtin_models())["context_windows"]
    return tuple(p for p, w in context_windows.items() if p != "default" and builtin.get(p) != w)


def apply_models(data: dict[str, Any]) -> None:
    """Set ``models`` to the merged table and fill every derived table the file did not set."""
    models = merge_models(data.get("models"))
    data["models"] = models
    derived = derived_tables(models)
    data.setdefault("context_windows", derived["context_windows"])
    tokens = data.get("tokens")
    if tokens is None:
        tokens = data["tokens"] = {}
    if isinstance(tokens, dict):
        for key in ("model_encodings", "model_factors", "default_encoding"):
            tokens.setdefault(key, derived[key])


# --- policies -----------------------------------------------------------------------------------


def merge_policies(user: object, builtin: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """The built-in policies with the user's merged in by name, every ``extends`` resolved."""
    result: dict[str, Any] = copy.deepcopy(dict(builtin))
    if user is None:
        return result
    if not isinstance(user, Mapping):
        raise MergeError("`policies`: expected a mapping of policy names")
    resolved: dict[str, Any] = {}

    def resolve(name: str, chain: tuple[str, ...]) -> Any:
        if name in resolved:
            return resolved[name]
        entry = user[name]
        if not isinstance(entry, Mapping) or "extends" not in entry:
            if isinstance(entry, Mapping) and "overrides" in entry:
                raise MergeError(
                    f"`policies.{name}.overrides`: only a policy that `extends` another has overrides"
                )
            resolved[name] = entry
            return entry
        parent = entry["extends"]
        if not isinstance(parent, str):
            raise MergeError(f"`policies.{name}.extends`: expected a policy name")
        if parent != name and parent in chain:
            raise MergeError(f"`policies.{name}.extends`: a cycle ({' -> '.join((*chain, parent))})")
        if parent in user and parent != name:
            base = resolve(parent, (*chain, parent))
        elif parent in builtin:  # a built-in name extending itself extends the built-in
            base = builtin[parent]
        else:
            names = sorted(set(builtin) | set(user))
            raise MergeError(f"`policies.{name}.extends`: no policy named {parent!r} (policies: {names})")
        if not isinstance(base, Mapping):
            raise MergeError(f"`policies.{name}.extends`: {parent!r} is not a valid policy")
        merged = _extend(name, parent, copy.deepcopy(dict(base)), entry)
        resolved[name] = merged
        return merged

    for name in user:
        result[str(name)] = resolve(name, (name,))
    return result


def _extend(name: str, parent: str, base: dict[str, Any], entry: Mapping[str, Any]) -> dict[str, Any]:
    unknown = set(entry) - {"extends", "overrides", "description", "stages", "safeguard", "pins"}
    if unknown:
        raise MergeError(f"`policies.{name}.{sorted(unknown)[0]}`: unknown key")
    for key in ("stages", "safeguard", "pins"):
        if key in entry:
            base[key] = copy.deepcopy(entry[key])
    overrides = entry.get("overrides") or {}
    if not isinstance(overrides, Mapping):
        raise MergeError(f"`policies.{name}.overrides`: expected a mapping of stage names")
    stages = base.get("stages") or []
    for stage_name, knobs in overrides.items():
        where = f"policies.{name}.overrides.{stage_name}"
        positions = [i for i, s in enumerate(stages) if isinstance(s, Mapping) and list(s) == [stage_name]]
        if not positions:
            have = [next(iter(s)) for s in stages if isinstance(s, Mapping) and s]
            raise MergeError(f"`{where}`: {parent} has no {stage_name} stage (its stages: {have})")
        if knobs is None:
            stages = [s for i, s in enumerate(stages) if i not in positions]
            continue
        if not isinstance(knobs, Mapping):
            raise MergeError(f"`{where}`: expected a mapping of the stage's settings, or null to remove it")
        for i in positions:
            stages[i] = {stage_name: {**(stages[i][stage_name] or {}), **knobs}}
    base["stages"] = stages
    if "description" in entry:
        base["description"] = entry["description"]
    else:
        changed = ", ".join(
            f"{stage} removed"
            if knobs is None
            else f"{stage}: " + ", ".join(f"{k}={v}" for k, v in knobs.items())
            for stage, knobs in overrides.items()
        )
        base["description"] = f"{parent}" + (f", with {changed}" if changed else "")
    return base


def policy_origins(user: object, builtin: Mapping[str, Any]) -> dict[str, str]:
    """Where each effective policy comes from, for ``check-config``."""
    origins = {name: "built-in" for name in builtin}
    if isinstance(user, Mapping):
        for name, entry in user.items():
            parent = entry.get("extends") if isinstance(entry, Mapping) else None
            if parent:
                origins[name] = f"extends {parent}"
            else:
                origins[name] = "replaces the built-in" if name in builtin else "yours"
    return origins
