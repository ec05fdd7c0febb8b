"""A model's window from its provider: asked once, and learned from its refusals.

Two moments of a compacting route:

- before compaction (``ask``): the first request for a model the ``models`` table does not
  cover (it would get the default window) asks the upstream's metadata once
  (``upstream/window_probe.py``); requests for the same model wait for that one answer, and the
  answer is kept (``state/learned_windows.py``).
- when the upstream refuses a request as over the window (``refusal``): the window its words
  name is learned, and when that window is smaller than the one the request was compacted for,
  the route compacts the client's request again to it and sends it once more, so the agent
  never sees the refusal. Only in enforce mode (shadow mode sends the client's bytes, so it
  learns the window and relays the refusal), and never twice for one request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proxy.config.merge import configured_window_patterns
from proxy.config.settings import Settings
from proxy.route.draft import Draft
from proxy.state.learned_windows import LEARNED_WINDOWS_FILE, ConfiguredModels, LearnedWindows
from proxy.state.token_factors import ScaledWindows, TokenFactors
from proxy.telemetry.exchange import Exchange
from proxy.telemetry.metrics import Metrics
from proxy.upstream.providers import Provider, make_providers
from proxy.upstream.window_probe import WindowProbe
from proxy.upstream.window_words import context_refusal

# Upstream and model pairs remembered as asked (bounded: clients choose model names).
_MAX_ASKED = 4096


class WindowLearning:
    def __init__(
        self,
        windows: ScaledWindows,
        learned: LearnedWindows,
        probe: WindowProbe | None,
        metrics: Metrics,
        log: Any,
    ) -> None:
        self.windows = windows
        self.learned = learned
        self.probe = probe
        self.metrics = metrics
        self.log = log
        self._asked: dict[tuple[str, str], asyncio.Future[None] | None] = {}
        # Whether the configuration or the table covers a model (asked per request: memoized).
        self._covered: dict[str, bool] = {}

    async def ask(self, draft: Draft) -> bool:
        """A route step: the model's window from the upstream's metadata, the first time."""
        parsed = draft.parsed
        model = parsed.neutral.get("model") if parsed is not None else None
        if self.probe is None or not isinstance(model, str):
            return True
        key = (draft.provider.base.key, model)
        if key not in self._asked:
            if len(self._asked) >= _MAX_ASKED or not self._unknown(model):
                self._asked.setdefault(key, None)
                return True
            self._asked[key] = asyncio.ensure_future(self._ask(draft.provider, model, draft.headers))
        pending = self._asked[key]
        if pending is not None and not pending.done():
            await asyncio.shield(pending)
        return True

    def _unknown(self, model: str) -> bool:
        """Whether the window would be a guess: nothing configured, told or in the table."""
        covered = self._covered.get(model)
        if covered is None:
            covered = self.learned.configured(model) or self.windows.covers(model)
            if len(self._covered) < _MAX_ASKED:
                self._covered[model] = covered
        return not covered and self.learned.window(model) is None

    async def _ask(self, provider: Provider, model: str, headers: list[tuple[bytes, bytes]]) -> None:
        assert self.probe is not None
        answer = await self.probe.ask(provider.base, model, provider.upstream_headers(headers))
        if answer is None:
            return
        learned = self.learned.learn(provider.base.key, model, answer.window, answer.source)
        if learned is not None:
            self.metrics.windows_learned.labels("metadata", "kept").inc()
            self.log.info(
                "model_window_learned",
                model=model[:200],
                window=answer.window,
                source=answer.source,
                upstream=provider.base.key,
            )

    def guessing(self, model: object) -> bool:
        """Whether the model's window is the default's guess (the route then keeps the
        client's bytes during the wait, to compact them again to the window a refusal names)."""
        return isinstance(model, str) and self._unknown(model)

    def fits(self, exchange: Exchange) -> bool:
        """Whether a request compacted again to a refused window now fits it (what the proxy
        counts of the view; a view the policy could not bring under it is not sent again)."""
        sent, model = exchange.tokens_after, exchange.model
        if sent is not None and sent <= self.windows.window_for(model):
            return True
        self.metrics.windows_learned.labels("refusal", "unfit").inc()
        return False

    def refusal(self, draft: Draft, *, again: bool) -> Callable[[int, bytes], bool] | None:
        """What the relay shows a small error answer to: True when the route sends the
        request ``again`` (it can), compacted to the window the refusal named."""
        exchange = draft.exchange
        model = exchange.model
        if not isinstance(model, str):
            return None
        retry = again and draft.mode == "enforce" and exchange.skipped is None
        upstream = draft.provider.base.key

        def refused(status: int, body: bytes) -> bool:
            said = context_refusal(status, body)
            if said is None:
                return False
            # Read now, not per request: refusals are rare. The window the request was made for.
            used, sent = self.windows.window_for(model), exchange.tokens_after
            scale = 1.0
            if said.prompt_tokens and sent and self.windows.factors.factor(model) == 1.0:
                # The provider counts more than the packaged encoding: hold its window in ours.
                scale = max(1.0, said.prompt_tokens / sent)
            learned = self.learned.learn(upstream, model, said.window, f"refusal {status}", scale)
            resend = learned is not None and retry and self.windows.window_for(model) < used
            self.metrics.windows_learned.labels("refusal", "retried" if resend else "relayed").inc()
            self.log.warning(
                "model_window_refused",
                model=model[:200],
                window=said.window,
                prompt_tokens=said.prompt_tokens,
                upstream=upstream,
                configured=learned is None,
                retried=resend,
                request_id=exchange.request_id,
            )
            if resend:
                exchange.context_retry = {
                    "status": status,
                    "window": said.window,
                    "prompt_tokens": said.prompt_tokens,
                    "window_before": used,
                    "window_after": self.windows.window_for(model),
                    "tokens_sent_before": sent,
                }
            return resend

        return refused


def configured_windows(
    settings: Settings, factors: TokenFactors, log: Any, metrics: Metrics
) -> ScaledWindows:
    """The models' windows; a model no pattern covers is logged and counted once with the
    window it gets."""

    def defaulted(model: str, window: int) -> None:
        log.warning(
            "model_window_defaulted",
            model=model[:200],
            window=window,
            fix=(
                "learned from the upstream's first context-length error, or set it in `models:`"
                if settings.upstream.learn_windows
                else "add the model to `models:`"
            ),
        )
        metrics.models_defaulted.labels(model[:100]).inc()

    providers = make_providers(settings)
    learned = LearnedWindows(
        Path(settings.state_dir) / LEARNED_WINDOWS_FILE if settings.upstream.learn_windows else None,
        (providers.openai.base.key, providers.anthropic.base.key, providers.gemini.base.key),
        ConfiguredModels(configured_window_patterns(settings.context_windows)),
    )
    learned.load()
    return ScaledWindows(settings.context_windows, factors, on_default=defaulted, learned=learned)
