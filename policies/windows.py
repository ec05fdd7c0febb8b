"""Context windows per model: glob patterns to tokens, first match wins, then ``default``."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping

DEFAULT_CONTEXT_WINDOWS: dict[str, int] = {
    "gpt-4o*": 128_000,
    "gpt-4.1*": 1_047_576,
    "gpt-5*": 400_000,
    "o1*": 200_000,
    "o3*": 200_000,
    "o4*": 200_000,
    "gpt-4-turbo*": 128_000,
    "gpt-4*": 8_192,
    "gpt-3.5-turbo*": 16_385,
    "claude-*": 200_000,
    "default": 128_000,
}


class ContextWindows:
    def __init__(self, windows: Mapping[str, int]) -> None:
        self._patterns = tuple((p, w) for p, w in windows.items() if p != "default")
        self._default = windows.get("default", 128_000)
        self._memo: dict[str, int] = {}

    def window_for(self, model: object) -> int:
        if not isinstance(model, str):
            return self._default
        found = self._memo.get(model)
        if found is None:
            found = next((w for p, w in self._patterns if fnmatch.fnmatchcase(model, p)), self._default)
            if len(self._memo) < 4096:
                self._memo[model] = found
        return found
