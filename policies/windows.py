"""Context windows per model: glob patterns to tokens, first match wins, then ``default``."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping

DEFAULT_CONTEXT_WINDOWS: dict[str, int] = {
    "gpt-4o*": 128_000,
    "gpt-4.1*": 1_047_576,
    "gpt-5*": 400_000,
    "o1*": 200_000,
    "o3*": 200_000,
    "o4*": 200_000,
    "codex-mini*": 200_000,
    "gpt-4-turbo*": 128_000,
    "gpt-4*": 8_192,
    "gpt-3.5-turbo*": 16_385,
    "claude-*": 200_000,
    "gemini-*": 1_048_576,
    "default": 128_000,
}


# Model names told about at most: clients choose them, and 20,000 names must not be 20,000 lines.
_TELL_AT_MOST = 32


class ContextWindows:
    """``on_default(model, window)`` is told, once per model name, of a model no pattern
    matches (it gets the default window): a window guessed silently is a window that may be
    wrong, so the proxy says which model to add to its table."""

    def __init__(
        self, windows: Mapping[str, int], on_default: Callable[[str, int], None] | None = None
    ) -> None:
        self._patterns = tuple((p, w) for p, w in windows.items() if p != "default")
        self._default = windows.get("default", 128_000)
        self._memo: dict[str, int] = {}
        self._on_default = on_default
        self._told = 0

    def covers(self, model: str) -> bool:
        """Whether a pattern of the table (not ``default``) matches ``model``."""
        return any(fnmatch.fnmatchcase(model, pattern) for pattern, _ in self._patterns)

    def window_for(self, model: object) -> int:
        if not isinstance(model, str):
            return self._default
        found = self._memo.get(model)
        if found is None:
            matched = next((w for p, w in self._patterns if fnmatch.fnmatchcase(model, p)), None)
            found = self._default if matched is None else matched
            if len(self._memo) < 4096:
                self._memo[model] = found
                if matched is None and self._on_default is not None and self._told < _TELL_AT_MOST:
                    self._told += 1
                    self._on_default(model, found)
        return found
