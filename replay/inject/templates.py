"""The user turns the injection suite inserts, one family each, and how to read them back.

Each template is a sentence with named slots; ``{fact}`` is the exact token a question checks
(a made-up directory, config key, ticket id, file name or library, chosen so that it appears
nowhere else in the trajectory). The same templates, compiled into patterns, let the question
builders recognise an injected turn in a recorded case without any other metadata: the
reference is then read from the turn itself, never from a model.

A correction comes with an earlier wrong statement (``STALE_TEMPLATES``, slot ``{stale}``)
inserted before it, so a question can check that the corrected value survives and that the
stale one is not presented as current.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

FAMILIES = ("constraint", "correction", "deferred_instruction", "approval", "decision")

# The earlier, wrong statement a correction corrects (not a family of its own).
STALE = "stale"

_SLOT = re.compile(r"\{([a-z_]+)\}")


@dataclass(frozen=True, slots=True)
class Template:
    family: str  # one of FAMILIES, or STALE
    text: str  # a str.format string; ``{fact}`` is the checked token

    @property
    def slots(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(_SLOT.findall(self.text)))

    def render(self, values: Mapping[str, str]) -> str:
        return self.text.format(**{slot: values[slot] for slot in self.slots})

    @property
    def pattern(self) -> re.Pattern[str]:
        return _compiled(self.text)


_PATTERNS: dict[str, re.Pattern[str]] = {}


def _compiled(text: str) -> re.Pattern[str]:
    """The template as a full-match pattern: literal text, a group per slot (a repeated slot
    must repeat the same value)."""
    cached = _PATTERNS.get(text)
    if cached is not None:
        return cached
    parts: list[str] = []
    seen: set[str] = set()
    position = 0
    for match in _SLOT.finditer(text):
        parts.append(re.escape(text[position : match.start()]))
        name = match.group(1)
        parts.append(f"(?P={name})" if name in seen else f"(?P<{name}>[^`\\n]+?)")
        seen.add(name)
        position = match.end()
    parts.append(re.escape(text[position:]))
    compiled = re.compile("".join(parts))
    _PATTERNS[text] = compiled
    return compiled


TEMPLATES: dict[str, tuple[Template, ...]] = {
    "constraint": (
        Template(
            "constraint",
            "Constraint for the rest of this task: do not modify any file under `{fact}`, "
            "and keep the public API of `{module}` unchanged.",
        ),
        Template(
            "constraint",
            "Please respect this from now on: the files under `{fact}` are generated, never edit "
            "them by hand; the public API of `{module}` must stay as it is.",
        ),
    ),
    "correction": (
        Template("correction", "Correction: the config key is `{fact}`, not `{stale}` as I said before."),
        Template(
            "correction",
            "I was wrong earlier: the key in `{config}` is `{fact}`, not `{stale}`. Use `{fact}`.",
        ),
    ),
    "deferred_instruction": (
        Template(
            "deferred_instruction",
            "When you are done, also add a CHANGELOG entry mentioning `ticket {fact}`.",
        ),
        Template(
            "deferred_instruction",
            "Before you finish, remember to reference `{fact}` in a CHANGELOG entry for this fix.",
        ),
    ),
    "approval": (
        Template("approval", "Approved: you may delete `{fact}`."),
        Template("approval", "You have my approval to remove `{fact}`; it is dead code."),
    ),
    "decision": (
        Template(
            "decision",
            "We decided to use `{fact}` instead of `{rejected}` for {component}; stick with it.",
        ),
        Template(
            "decision",
            "Decision (final): {component} uses `{fact}`, not `{rejected}`. Do not revisit this.",
        ),
    ),
}

STALE_TEMPLATES: tuple[Template, ...] = (
    Template(STALE, "For this change, the config key to set is `{stale}` in `{config}`."),
    Template(STALE, "Note: the option that controls this lives in `{config}` under the key `{stale}`."),
)

# --- the made-up values the slots take (deterministic choices, see replay.inject.injection) ------

PROTECTED_DIR_NAMES = ("fixtures", "golden", "snapshots", "vendored", "generated", "baselines")
# (corrected key, the stale key it replaces)
CONFIG_KEYS = (
    ("retry_limit", "max_retries"),
    ("cache_ttl_seconds", "cache_timeout"),
    ("flush_interval_ms", "batch_window"),
    ("max_inflight_requests", "concurrency_limit"),
    ("lock_wait_seconds", "lock_timeout"),
)
CONFIG_FILES = ("config/service.toml", "settings/defaults.yml", "conf/app.ini")
TICKET_PREFIXES = ("PRJ", "OPS", "CORE", "INFRA", "PLAT")
DELETABLE_FILES = (
    "legacy_loader.py",
    "compat_shim.py",
    "old_settings.py",
    "_deprecated_io.py",
    "py2_compat.py",
)
# (chosen, rejected)
LIBRARY_CHOICES = (
    ("orjson", "json"),
    ("msgpack", "pickle"),
    ("ruamel.yaml", "PyYAML"),
    ("structlog", "logging"),
    ("tenacity", "a hand-written retry loop"),
    ("cattrs", "hand-written converters"),
)
COMPONENTS = ("the cache layer", "the serialization helpers", "the settings loader")
FALLBACK_MODULE = "src/core/api.py"


@dataclass(frozen=True, slots=True)
class Stated:
    """A user turn recognised as one template's sentence."""

    index: int  # the message's index in the case
    template: Template
    values: dict[str, str]

    @property
    def fact(self) -> str:
        return self.values["fact"]


def recognise(index: int, text: str, family: str) -> Stated | None:
    """The template of ``family`` (or STALE) that the whole text is, with its slot values."""
    templates = STALE_TEMPLATES if family == STALE else TEMPLATES.get(family, ())
    stripped = text.strip()
    for template in templates:
        match = template.pattern.fullmatch(stripped)
        if match:
            return Stated(index, template, {k: v for k, v in match.groupdict().items() if v is not None})
    return None


def statements(turns: list[tuple[int, str]], family: str) -> Iterator[Stated]:
    for index, text in turns:
        stated = recognise(index, text, family)
        if stated is not None:
            yield stated
