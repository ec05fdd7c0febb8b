"""The session page's list: a tenant's recent sessions, summed from their compaction events.

Pure: the events come in, rows go out. A session here is what the store keys events by, one
conversation under one policy (``s_...:improved``); ``client_session`` is the ``X-Session-Id``
the client named it with, where it sent one (events recorded before it was kept lack it). Its
figures are the sums over its events: requests the policy did nothing to are counted only
when ``events.record_skipped`` records them, so before a session's first compaction point the
figures start at its first event.

Its cost figures: ``prompt_savings_usd``, the prompt tokens saved at the model's input price;
``compaction_cost_usd``, the compaction's own cost (the summarizer's tokens, of its points and
its preparations, ``proxy/telemetry/compaction_cost.py``) at the summarizer model's prices; and
``savings_usd``, what was saved net of it (the first less the second).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from proxy.config.sections import ModelSettings
from proxy.state.prompt_clock import ModelShares
from proxy.state.session_rollup import merge, rollup
from proxy.telemetry.compaction_cost import priced_usd


class PriceColumn:
    """US dollars per million tokens by model name: one price column of the ``models`` table
    (``input_price`` unless told), the first pattern that matches and sets it."""

    def __init__(self, models: Mapping[str, ModelSettings], column: str = "input_price") -> None:
        self._patterns = [
            (pattern, getattr(entry, column))
            for pattern, entry in models.items()
            if pattern != "default" and getattr(entry, column) is not None
        ]
        default = models.get("default")
        self._default = getattr(default, column) if default is not None else None

    def per_million(self, model: object) -> float | None:
        if not isinstance(model, str):
            return self._default
        found = next((price for p, price in self._patterns if fnmatch.fnmatchcase(model, p)), None)
        return found if found is not None else self._default


def cache_price_shares(models: Mapping[str, ModelSettings]) -> ModelShares:
    """Each model's cache read and write prices as shares of its input price, from the
    ``models`` table (None where a price is not set): what the prompt clock prices rewrites by."""
    full, cached, written = (
        PriceColumn(models, column) for column in ("input_price", "cached_input_price", "cache_write_price")
    )

    def shares(model: object) -> tuple[float | None, float | None]:
        price = full.per_million(model)
        if not price:
            return None, None
        read, write = cached.per_million(model), written.per_million(model)
        return (None if read is None else read / price, None if write is None else write / price)

    return shares


class SummarizerPrices(NamedTuple):
    """The summarizer model's input and output prices (US dollars per million tokens, or None):
    what the compaction's own tokens cost."""

    input: float | None = None
    output: float | None = None

    @classmethod
    def of(cls, models: Mapping[str, ModelSettings], model: str) -> SummarizerPrices:
        output = PriceColumn(models, "output_price").per_million(model)
        return cls(PriceColumn(models).per_million(model), output)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def priced(
    rows: Iterable[Mapping[str, Any]], prices: PriceColumn, summarizer: SummarizerPrices | None = None
) -> list[dict[str, Any]]:
    """Session rollups (``proxy.state.session_rollup``) as the list shows them: the tokens saved
    per model priced (``prompt_savings_usd``: None when no model has a price), the compaction's
    own tokens at the summarizer's prices (``compaction_cost_usd``: None when it spent some and
    has no price), the savings net of it (``savings_usd``: None when either is unknown), the
    per-model figures dropped."""
    summarizer = summarizer or SummarizerPrices()
    shown: list[dict[str, Any]] = []
    for kept in rows:
        row = {k: v for k, v in kept.items() if k != "saved_by_model"}
        savings: float | None = None
        for model, tokens in kept.get("saved_by_model") or ():
            price = prices.per_million(model)
            if price is not None:
                savings = (savings or 0.0) + int(tokens) * price / 1e6
        row["compaction_input_tokens"] = own_input = int(kept.get("compaction_input_tokens") or 0)
        row["compaction_output_tokens"] = own_output = int(kept.get("compaction_output_tokens") or 0)
        own = priced_usd(own_input, own_output, summarizer.input, summarizer.output)
        row["prompt_savings_usd"] = _rounded(savings)
        row["compaction_cost_usd"] = _rounded(own)
        row["savings_usd"] = _rounded(None if savings is None or own is None else savings - own)
        shown.append(row)
    return shown


def summarize_sessions(
    events: Iterable[Mapping[str, Any]],
    prices: PriceColumn,
    limit: int = 50,
    summarizer: SummarizerPrices | None = None,
) -> list[dict[str, Any]]:
    """The ``limit`` sessions with the newest events, newest first: the same rollups a store
    keeps as it writes events, summed here from the events themselves."""
    rows: dict[str, dict[str, Any]] = {}
    for event in events:
        key = str(event.get("session", ""))
        rows[key] = merge(rows.get(key), rollup(key, event))
    ordered = sorted(rows.values(), key=lambda r: r["last"], reverse=True)[:limit]
    return priced(ordered, prices, summarizer)
