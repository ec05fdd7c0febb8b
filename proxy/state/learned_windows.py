"""Context windows the providers told the proxy: per upstream and model, kept across restarts.

A window is learned from the upstream's metadata (``upstream/window_probe.py``) or from its
refusal of a request over the window (``upstream/window_words.py``); either way it is the
provider's own number. The rules:

- a window set in your configuration for the model (a ``models`` pattern of yours, not the
  built-in table's) always wins: nothing is learned for it;
- otherwise the latest thing the provider said wins, over the built-in table and the default;
- where a refusal also says how many tokens the provider counted in the prompt and that is
  more than the proxy counted, the window is held in the proxy's count (``scale``: the
  provider's tokens per proxy token), so a model whose tokenizer counts more than the packaged
  encoding is still compacted below its real window.

Kept in ``<state_dir>/learned_windows.json`` (owner-only, written atomically), keyed by the
upstream's base URL: a window learned from one server is never applied to another one.
"""

from __future__ import annotations

import fnmatch
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

LEARNED_WINDOWS_FILE = "learned_windows.json"
# Models remembered per upstream (a client chooses model names: the table must stay bounded).
MAX_MODELS = 1024


@dataclass(frozen=True, slots=True)
class Learned:
    window: int  # in the provider's tokens
    source: str  # where it was said: "refusal 400", "GET /v1/models max_model_len"...
    at: float  # unix seconds
    scale: float = 1.0  # the provider's tokens per proxy-counted token (>= 1)

    @property
    def counted(self) -> int:
        """The window in the proxy's own count."""
        return int(self.window / self.scale)


class LearnedWindows:
    """``upstreams``: the configured base URLs (only their entries are loaded and used);
    ``configured(model)``: whether your configuration sets the model's window."""

    def __init__(
        self, path: Path | None, upstreams: Iterable[str], configured: Callable[[str], bool]
    ) -> None:
        self.path = path
        self.upstreams = tuple(dict.fromkeys(upstreams))
        self.configured = configured
        self._learned: dict[str, dict[str, Learned]] = {u: {} for u in self.upstreams}
        # The smallest window any configured upstream gave a model: what a lookup by model uses.
        self._by_model: dict[str, Learned] = {}

    def window(self, model: object) -> int | None:
        """The learned window of ``model`` in the proxy's count, if any (a dict lookup)."""
        learned = self._by_model.get(model) if isinstance(model, str) else None
        return learned.counted if learned is not None else None

    def get(self, model: str) -> Learned | None:
        return self._by_model.get(model)

    def learn(
        self, upstream: str, model: str, window: int, source: str, scale: float = 1.0
    ) -> Learned | None:
        """Record what the provider said; None when your configuration sets this model's window."""
        if upstream not in self._learned or self.configured(model):
            return None
        models = self._learned[upstream]
        if model not in models and len(models) >= MAX_MODELS:
            models.pop(next(iter(models)))
        learned = Learned(window, source, round(time.time(), 3), round(max(1.0, scale), 4))
        models.pop(model, None)
        models[model] = learned
        self._index(model)
        self.save()
        return learned

    def _index(self, model: str) -> None:
        said = [m[model] for m in self._learned.values() if model in m]
        if said:
            self._by_model[model] = min(said, key=lambda learned: learned.counted)
        else:
            self._by_model.pop(model, None)

    def told(self) -> dict[str, int]:
        """Each model's window as its provider told it (the smallest any upstream gave)."""
        return {model: learned.window for model, learned in self._by_model.items()}

    def entries(self) -> list[dict[str, Any]]:
        """Every learned window, for ``check-config``, the admin API and the session page."""
        return [
            {"upstream": upstream, "model": model, **asdict(learned), "counted": learned.counted}
            for upstream, models in self._learned.items()
            for model, learned in models.items()
        ]

    def load(self) -> None:
        data = read_learned(self.path) if self.path is not None else {}
        for upstream in self.upstreams:
            for model, fields in list(data.get(upstream, {}).items())[-MAX_MODELS:]:
                learned = _learned(fields)
                if isinstance(model, str) and learned is not None and not self.configured(model):
                    self._learned[upstream][model] = learned
                    self._index(model)

    def save(self) -> None:
        """Write every upstream's windows (others' entries in the file are kept); a failure
        costs only relearning after a restart."""
        if self.path is None:
            return
        data = read_learned(self.path)
        for upstream, models in self._learned.items():
            data[upstream] = {model: asdict(learned) for model, learned in models.items()}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".learned_windows.")
            with os.fdopen(handle, "wb") as file:
                file.write(orjson.dumps(data, option=orjson.OPT_INDENT_2))
            os.replace(temporary, self.path)
        except OSError:
            pass


class ConfiguredModels:
    """Whether a model matches one of your own window patterns (memoized: asked per request)."""

    def __init__(self, patterns: Iterable[str]) -> None:
        self.patterns = tuple(patterns)
        self._memo: dict[str, bool] = {}

    def __call__(self, model: str) -> bool:
        found = self._memo.get(model)
        if found is None:
            found = any(fnmatch.fnmatchcase(model, pattern) for pattern in self.patterns)
            if len(self._memo) < 4096:
                self._memo[model] = found
        return found


def read_learned(path: Path) -> dict[str, dict[str, Any]]:
    """The file's windows by upstream and model ({} when missing or unreadable)."""
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {u: m for u, m in data.items() if isinstance(u, str) and isinstance(m, dict)}


def _learned(fields: object) -> Learned | None:
    if not isinstance(fields, dict):
        return None
    window, source = fields.get("window"), fields.get("source")
    at, scale = fields.get("at", 0.0), fields.get("scale", 1.0)
    if not isinstance(window, int) or isinstance(window, bool) or window < 256 or not isinstance(source, str):
        return None
    if not isinstance(at, int | float) or not isinstance(scale, int | float) or not 1.0 <= scale <= 10.0:
        return None
    return Learned(window, source[:80], float(at), float(scale))
