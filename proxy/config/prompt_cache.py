"""The ``prompt_cache`` section: each provider's prompt cache, so compaction is timed by it.

A provider bills a cached prefix at a discount and forgets it after minutes without use.
With these the proxy tells a policy whether a session's prefix is still cached
(``policies/prompt_cache.py``): a session back after its cache expired may be compacted at a
lower mark and have obsolete outputs rewritten (its prefix is a miss anyway), and a warm one
is rewritten only when the tokens saved pay for the cache lost.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec


class ProviderCache(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    # How long the provider keeps an unused prefix, in seconds (OpenAI: 5-10 minutes; Anthropic:
    # 5 minutes, or 1 hour with a `ttl: 1h` breakpoint; Gemini's implicit cache: minutes).
    ttl_seconds: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    # A cached prompt token's price and a token written to the cache, as a share of an uncached
    # one (a model's own `cached_input_price`/`cache_write_price` in `models` count instead).
    read_price: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.5
    write_price: Annotated[float, msgspec.Meta(ge=1, le=4)] = 1.0


class PromptCacheSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    # false: every policy is time-blind (the cache is never consulted).
    enabled: bool = True
    # `wall`: the proxy's clock. `request`: the request's `X-Compaction-Clock` header (seconds,
    # any origin), as a replay sends its simulated time; a request without it is time-blind.
    clock: Literal["wall", "request"] = "wall"
    # By door: Chat Completions and Responses (OpenAI's rule; gpt-4o's 0.5x, set 0.25 for
    # gpt-4.1, 0.1 for gpt-5), Anthropic Messages, Gemini and Code Assist.
    openai: ProviderCache = msgspec.field(default_factory=ProviderCache)
    anthropic: ProviderCache = msgspec.field(
        default_factory=lambda: ProviderCache(ttl_seconds=300.0, read_price=0.1, write_price=1.25)
    )
    gemini: ProviderCache = msgspec.field(
        default_factory=lambda: ProviderCache(ttl_seconds=300.0, read_price=0.25, write_price=1.0)
    )

    def for_door(self, door: str) -> ProviderCache:
        if door == "anthropic":
            return self.anthropic
        if door in ("gemini", "code_assist"):
            return self.gemini
        return self.openai
