"""Compaction timed by the provider's prompt cache, through the running proxy (``improved``,
``prompt_cache.clock: request`` so a test can say when each request is sent; the wall clock is
the default and reads the same way).

- A session back after its cache expired is compacted from the lower mark (0.6 x window) and
  has its obsolete outputs rewritten, where the same history sent warm goes through untouched.
- A warm session's early large read, read again later, leaves the prefix when the rewrite pays.
- The clock header is the proxy's own: the upstream never sees it.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.fake_upstream import FakeUpstream
from tests.policies.test_cache_timing import session

pytestmark = pytest.mark.e2e

SUPERSEDED = "Superseded (read again later)"


def send(proxy: Any, messages: list[Any], session_id: str, at: float) -> httpx.Response:
    response = httpx.post(
        proxy.base_url + "/chat/completions",
        json={"model": "gpt-4o", "messages": messages},
        headers={
            "authorization": "Bearer sk-e2e",
            "x-session-id": session_id,
            "x-compaction-clock": f"{at}",
        },
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response


def sent_text(upstream: FakeUpstream) -> str:
    return str(upstream.requests[-1].json()["messages"])


def test_a_session_back_after_its_cache_expired_is_compacted_at_the_lower_mark(
    start_proxy: Any, upstream: FakeUpstream
) -> None:
    messages = session(steps_after=3)
    probe = start_proxy({"context_windows": {"default": 1_000_000}})
    tokens = int(send(probe, messages, "probe", 0).headers["x-compaction-tokens-before"])
    # The whole request (with the answer's reserve) at about 0.68 of the window: under 0.75.
    window = int((tokens + 1024) / 0.68)
    proxy = start_proxy({"context_windows": {"default": window}, "prompt_cache": {"clock": "request"}})
    earlier = messages[:-2]
    for name, gap in (("warm", 20.0), ("cold", 900.0)):
        send(proxy, earlier, name, 0.0)
        response = send(proxy, messages, name, gap)
        if name == "warm":
            assert "x-compaction-trigger" not in response.headers
            assert SUPERSEDED not in sent_text(upstream)
        else:
            assert response.headers["x-compaction-trigger"] == "threshold"
            assert int(response.headers["x-compaction-tokens-after"]) < tokens
            assert SUPERSEDED in sent_text(upstream)
        assert all("x-compaction-clock" not in r.headers for r in upstream.requests)


def test_a_warm_prefix_is_rewritten_when_it_pays(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy({"prompt_cache": {"clock": "request"}})
    long = session(steps_after=20)
    send(proxy, long[:-2], "s", 0.0)
    assert SUPERSEDED not in sent_text(upstream)
    send(proxy, long, "s", 20.0)
    assert SUPERSEDED in sent_text(upstream)
    # Time-blind (no clock header with `clock: request`): it waits for a compaction point.
    send(proxy, long[:-2], "blind", 0.0)
    response = httpx.post(
        proxy.base_url + "/chat/completions",
        json={"model": "gpt-4o", "messages": long},
        headers={"authorization": "Bearer sk-e2e", "x-session-id": "blind"},
        timeout=30,
    )
    assert response.status_code == 200
    assert SUPERSEDED not in sent_text(upstream)


def test_replicas_on_one_redis_share_each_sessions_last_send(
    start_proxy: Any, upstream: FakeUpstream, redis_url: str
) -> None:
    """Behind a balancer without stickiness: the request before the pause goes to one replica,
    the one after it to another, which knows from Redis that the session's cache expired."""
    messages = session(steps_after=3)
    probe = start_proxy({"context_windows": {"default": 1_000_000}})
    tokens = int(send(probe, messages, "probe", 0).headers["x-compaction-tokens-before"])
    config = {
        "context_windows": {"default": int((tokens + 1024) / 0.68)},
        "prompt_cache": {"clock": "request"},
        "store": {"backend": "redis", "redis_url": redis_url},
    }
    first, second = start_proxy(config), start_proxy(config)
    for name, gap in (("warm", 20.0), ("cold", 900.0)):
        send(first, messages[:-2], f"replicas-{name}", 0.0)
        response = send(second, messages, f"replicas-{name}", gap)
        if name == "warm":
            assert "x-compaction-trigger" not in response.headers
        else:
            assert response.headers["x-compaction-trigger"] == "threshold"
            assert SUPERSEDED in sent_text(upstream)
