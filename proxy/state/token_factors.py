"""Token counts for models whose tokenizer the proxy does not have (Claude), held to the real count.

There is no offline Claude tokenizer. The proxy counts with its packaged encoding and multiplies
by a per-model factor: a configured default (``tokens.model_factors``, with a safety margin),
then, as answers arrive, one **calibrated** from the prompt tokens the upstream reports for the
view it was sent (``input_tokens`` plus cache reads and writes, for Anthropic). The factor is
the 90th percentile of the last ratios of a model (requests of at least ``min_tokens``, where
fixed overheads do not dominate) plus a small margin, bounded; models and samples are bounded
too, and the samples are kept in a file so a restart does not start cold.

**No tenant steers another's window.** Samples are kept per tenant (each tenant's last
``samples`` ratios, at most ``max_tenants`` tenants per model), each tenant's 90th percentile is
taken, and the model's factor is the median of those: whatever one tenant's requests report, a
model seen by three or more tenants keeps a factor inside the range the others give (with one
tenant, that tenant's own; with two, at most half way), always within ``bounds``.

A model's count also has a fixed part no message holds: Anthropic adds a tool-use system prompt
of 346 tokens to every request that declares tools (``FIXED_TOKENS``). It is taken off the
reported count before the ratio, and off the window: the estimate is ``n * factor + fixed``.

The policies stay in the proxy's own count: the factor scales the **window** instead
(``ScaledWindows``), so a view of ``n`` counted tokens is held to ``n * factor + fixed <=
window``.
"""

from __future__ import annotations

import fnmatch
import math
import os
import statistics
import tempfile
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path

import orjson

from policies.windows import ContextWindows
from proxy.state.learned_windows import LearnedWindows

MIN_SAMPLES = 3
# Prompt tokens a model's provider adds to a request with tools (Anthropic's tool-use system
# prompt: 346 tokens for tool_choice auto or none, 313 for any or tool).
FIXED_TOKENS: dict[str, int] = {"claude-*": 346}


class TokenFactors:
    def __init__(
        self,
        defaults: Mapping[str, float],
        *,
        calibrate: bool = True,
        path: Path | None = None,
        max_models: int = 256,
        max_tenants: int = 64,
        samples: int = 32,
        min_tokens: int = 1024,
        margin: float = 0.02,
        bounds: tuple[float, float] = (0.5, 4.0),
    ) -> None:
        self._patterns = tuple(defaults.items())
        self.calibrate = calibrate
        self.path = path
        self.max_models = max_models
        self.max_tenants = max_tenants
        self.samples = samples
        self.min_tokens = min_tokens
        self.margin = margin
        self.bounds = bounds
        self._fixed_patterns = tuple(FIXED_TOKENS.items())
        self._default: dict[str, float | None] = {}
        # model -> tenant -> that tenant's last ratios
        self._ratios: dict[str, dict[str, deque[float]]] = {}
        self._calibrated: dict[str, float] = {}
        self.dirty = False

    def default_for(self, model: object) -> float | None:
        """The configured factor of a model (None: its count needs none)."""
        if not isinstance(model, str) or not self._patterns:
            return None
        if model not in self._default:
            found = next((f for p, f in self._patterns if fnmatch.fnmatchcase(model, p)), None)
            if len(self._default) >= 4096:
                return found
            self._default[model] = found
        return self._default[model]

    def fixed_for(self, model: object) -> int:
        """The tokens a model's provider adds to a request with tools (0: none known)."""
        if not isinstance(model, str) or self.default_for(model) is None:
            return 0
        return next((n for p, n in self._fixed_patterns if fnmatch.fnmatchcase(model, p)), 0)

    def estimate(self, model: object, counted: int, tools: bool = True) -> int:
        """The upstream's count of a request the proxy counted ``counted``."""
        return round(counted * self.factor(model)) + (self.fixed_for(model) if tools else 0)

    def factor(self, model: object) -> float:
        default = self.default_for(model)
        if default is None:
            return 1.0
        return self._calibrated.get(model, default) if isinstance(model, str) else default

    def observe(
        self, model: object, counted: int, reported: int, tools: bool = True, tenant: str = ""
    ) -> float | None:
        """One answer's reported prompt tokens for a view the proxy counted: the ratio taken
        into the model's calibration (among ``tenant``'s samples), or None when it is not used."""
        if not self.calibrate or self.default_for(model) is None or not isinstance(model, str):
            return None
        if counted < self.min_tokens or reported <= 0:
            return None
        ratio = (reported - (self.fixed_for(model) if tools else 0)) / counted
        low, high = self.bounds
        if not low <= ratio <= high:
            return None  # a reported count this far off is not a tokenizer difference
        self._samples(model, tenant).append(ratio)
        self._update(model)
        self.dirty = True
        return ratio

    def _samples(self, model: str, tenant: str) -> deque[float]:
        tenants = self._ratios.get(model)
        if tenants is None:
            if len(self._ratios) >= self.max_models:
                oldest = next(iter(self._ratios))
                self._ratios.pop(oldest)
                self._calibrated.pop(oldest, None)
            tenants = self._ratios[model] = {}
        samples = tenants.pop(tenant, None)
        if samples is None:
            samples = deque(maxlen=self.samples)
            while len(tenants) >= self.max_tenants:
                tenants.pop(next(iter(tenants)))
        tenants[tenant] = samples  # most recently seen last
        return samples

    def _update(self, model: str) -> None:
        per_tenant = [_p90(s) for s in self._ratios[model].values() if len(s) >= MIN_SAMPLES]
        if not per_tenant:
            return
        low, high = self.bounds
        self._calibrated[model] = min(high, max(low, statistics.median(per_tenant) * (1 + self.margin)))

    def snapshot(self) -> dict[str, dict[str, object]]:
        """Per model: the factor in use, the configured one, and the samples behind it."""
        return {
            model: {
                "factor": round(self.factor(model), 4),
                "default": self.default_for(model),
                "samples": sum(len(s) for s in tenants.values()),
                "tenants": len(tenants),
                "last_ratio": round(next(reversed(tenants.values()))[-1], 4) if tenants else None,
            }
            for model, tenants in self._ratios.items()
        }

    def load(self) -> None:
        if self.path is None or not self.calibrate:
            return
        try:
            data = orjson.loads(self.path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return  # none yet, or unreadable: start from the defaults
        ratios = data.get("ratios") if isinstance(data, dict) else None
        if not isinstance(ratios, dict):
            return
        for model, values in list(ratios.items())[: self.max_models]:
            if not isinstance(model, str) or self.default_for(model) is None:
                continue
            # A file written before samples were kept per tenant holds one list: one tenant.
            by_tenant = {"": values} if isinstance(values, list) else values
            if not isinstance(by_tenant, dict):
                continue
            for tenant, samples in list(by_tenant.items())[-self.max_tenants :]:
                if not isinstance(tenant, str) or not isinstance(samples, list):
                    continue
                kept = [
                    v for v in samples if isinstance(v, int | float) and self.bounds[0] <= v <= self.bounds[1]
                ]
                if kept:
                    self._samples(model, tenant).extend(kept[-self.samples :])
            if model in self._ratios:
                self._update(model)

    def save(self) -> None:
        """Write the samples (atomically, owner-only); a failure costs only a cold restart."""
        if self.path is None or not self.dirty:
            return
        self.dirty = False
        data = orjson.dumps(
            {"ratios": {m: {t: list(s) for t, s in tenants.items()} for m, tenants in self._ratios.items()}}
        )
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".token_factors.")
            with os.fdopen(handle, "wb") as file:
                file.write(data)
            os.replace(temporary, self.path)
        except OSError:
            self.dirty = True


def _p90(samples: deque[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]


class ScaledWindows(ContextWindows):
    """Context windows in the proxy's count: a model's window (the one its provider told,
    ``learned``, else the table's) divided by its token factor."""

    def __init__(
        self,
        windows: Mapping[str, int],
        factors: TokenFactors,
        on_default: Callable[[str, int], None] | None = None,
        learned: LearnedWindows | None = None,
    ) -> None:
        super().__init__(windows, on_default)
        self.factors = factors
        self.learned = learned

    def window_for(self, model: object) -> int:
        told = self.learned.window(model) if self.learned is not None else None
        window = told if told is not None else super().window_for(model)
        factor = self.factors.factor(model)
        if factor == 1.0:
            return window
        return int((window - self.factors.fixed_for(model)) / factor)

    def real_window(self, model: object) -> int:
        told = self.learned.get(model) if self.learned is not None and isinstance(model, str) else None
        return told.window if told is not None else super().window_for(model)
