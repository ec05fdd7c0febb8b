"""The canary on the Gemini door: Gemini's usage (``usageMetadata``, repeated in every chunk
of a stream) and its context-window refusal ("The input token count (N) exceeds the maximum
number of tokens allowed (M).") are what the arms' figures count, as on the other doors."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.test_gemini_door import KEY, STEPS, TASK, WINDOW, config
from tests.gemini_upstream import GeminiUpstream
from tests.gemini_upstream.client import run_agent

pytestmark = pytest.mark.e2e


@pytest.fixture
def server() -> Iterator[GeminiUpstream]:
    started = GeminiUpstream(window=WINDOW, steps=STEPS, read_every=4, api_key=KEY).start()
    yield started
    started.stop()


def sample(metrics: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in metrics.splitlines():
        found = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if found and ",".join(sorted(found.group(1).split(","))) == wanted:
            return float(found.group(2))
    return 0.0


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_treated_sessions_are_counted_from_gemini_usage(
    server: GeminiUpstream, start_proxy: Any, stream: bool
) -> None:
    proxy = start_proxy({**config(server), "mode": "canary", "canary": {"share": 1.0}})
    run_agent(proxy.url, stream=stream, run=f"canary-{stream}", key=KEY, task=TASK)
    metrics = httpx.get(proxy.url + "/metrics", timeout=10).text
    name = "compaction_proxy_canary_tokens_total"
    prompt = sample(metrics, name, arm="treated", kind="prompt")
    reported = sum(s.tokens for s in server.requests if s.kind != "refused")
    # Every round's prompt as the fake reported it (read rounds included), once each.
    assert prompt == pytest.approx(reported, rel=0.02), (prompt, reported)
    assert sample(metrics, name, arm="treated", kind="output") > 0
    outcomes = "compaction_proxy_canary_outcomes_total"
    assert sample(metrics, outcomes, arm="treated", outcome="read") > 0
    assert sample(metrics, outcomes, arm="treated", outcome="context_error") == 0
    assert sample(metrics, outcomes, arm="treated", outcome="final_answer") == 1


def test_the_holdouts_refusal_in_googles_words_is_a_context_error(
    server: GeminiUpstream, start_proxy: Any
) -> None:
    proxy = start_proxy({**config(server), "mode": "canary", "canary": {"share": 0.0}})
    with pytest.raises(AssertionError, match="exceeds the maximum number of tokens allowed"):
        run_agent(proxy.url, stream=True, run="holdout", key=KEY, task=TASK)
    metrics = httpx.get(proxy.url + "/metrics", timeout=10).text
    outcomes = "compaction_proxy_canary_outcomes_total"
    assert sample(metrics, outcomes, arm="holdout", outcome="context_error") == 1
    assert sample(metrics, outcomes, arm="holdout", outcome="client_error") == 0
