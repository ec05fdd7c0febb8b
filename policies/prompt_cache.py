"""The provider's prompt cache as a policy sees it, and when rewriting a cached prefix pays.

A provider bills a prompt's cached prefix at a discount (OpenAI 0.25-0.5x, Anthropic 0.1x,
Gemini 0.25x) and forgets it after some minutes of inactivity (OpenAI about 5-10, Anthropic 5
or 60 by breakpoint). So *when* a policy rewrites the history matters as much as what it
rewrites: a change deep in a warm prefix makes every token after it a miss (on Anthropic a
cache write, 1.25x), while a session back after its cache expired pays for its whole prefix
anyway, and a rewrite then costs nothing extra.

The proxy knows when each session's prefix was last sent and the provider's lifetime and
prices (``prompt_cache`` in the config); it hands a stage a ``PromptCache``. Without one
(``Context.cache`` None) the stages are time-blind, as before this module.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PromptCache:
    """What the proxy knows of the provider's cache of this session's prefix."""

    # Seconds since the session's previous request went upstream; None: no previous request.
    idle_seconds: float | None
    # The provider's cache lifetime without use, in seconds.
    ttl_seconds: float
    # A cached prompt token's price, and a token written to the cache (a rewritten prefix is
    # written: Anthropic bills 1.25x; OpenAI and Gemini's implicit caches bill 1x), as a share
    # of an uncached prompt token's.
    read_price: float = 0.5
    write_price: float = 1.0

    @property
    def cold(self) -> bool:
        """The prefix is a miss whatever is sent: the session's previous request is older than
        the cache's lifetime (a session's first request is not cold: nothing to rewrite)."""
        return self.idle_seconds is not None and self.idle_seconds > self.ttl_seconds


def rewrite_pays(
    saved_tokens: int, rewritten_tokens: int, requests_ahead: float, cache: PromptCache, payback: float
) -> bool:
    """Whether rewriting a warm prefix from some point on pays for itself: every token after
    the point goes from a cache read to a write once (``rewritten_tokens`` x (write - read)),
    and each of the ``requests_ahead`` later requests reads ``saved_tokens`` fewer cached
    tokens. ``payback``: how many times over the saving must cover the rewrite (the requests
    ahead are a guess)."""
    if saved_tokens <= 0 or requests_ahead <= 0:
        return False
    if cache.cold:
        return True
    cost = rewritten_tokens * max(cache.write_price - cache.read_price, 0.0)
    return saved_tokens * cache.read_price * requests_ahead >= payback * cost
