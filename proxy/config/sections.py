"""The summarizer's settings (the ``summarizer`` section): which summarizer, where, its
limits, its breaker, and whether summaries are prepared ahead."""

from __future__ import annotations

import re
from typing import Annotated, Literal

import msgspec


class SummarizerSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    kind: Literal["ledger", "openai"] = "ledger"
    base_url: str | None = None
    api_key: str | None = None
    model: str = "gpt-4o-mini"
    timeout: Annotated[float, msgspec.Meta(gt=0)] = 60.0
    max_retries: Annotated[int, msgspec.Meta(ge=0, le=10)] = 2
    max_output_tokens: Annotated[int, msgspec.Meta(ge=64)] = 2000
    # Largest summarizer input (prompt plus history), in tokens; null: no limit.
    max_input_tokens: Annotated[int, msgspec.Meta(ge=1000)] | None = None
    breaker_failures: Annotated[int, msgspec.Meta(ge=1)] = 3
    breaker_cooldown: Annotated[float, msgspec.Meta(ge=0)] = 300.0
    # Prepare the model summary ahead, off the request path, once a request passes this share
    # of the window; a compaction point then never waits for the summarizer (it uses a checked
    # prepared summary, or the ledger alone at once). null: a compaction point waits for it.
    prepare_at: Annotated[float, msgspec.Meta(gt=0, lt=1)] | None = None
    # Preparations running at once, per process and per tenant.
    prepare_concurrency: Annotated[int, msgspec.Meta(ge=1)] = 2

    def __post_init__(self) -> None:
        if self.base_url is not None and not re.match(r"^https?://[^/\s]+", self.base_url):
            raise ValueError("base_url must be an http:// or https:// URL")
