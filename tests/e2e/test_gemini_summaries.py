"""The Gemini door with a model summarizer, summaries prepared ahead, the sessions list and
the session page: what the other doors have, through the running proxy. The summarizer is any
OpenAI-compatible endpoint (here a keyless fake, as a local model would be): a Gemini client's
key never goes to it (``proxy/summaries/credentials.py``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.test_gemini_door import KEY, STEPS, TASK, WINDOW, config
from tests.fake_upstream import FakeUpstream, Recorded, Reply, completion
from tests.gemini_upstream import GeminiUpstream
from tests.gemini_upstream.client import run_agent

pytestmark = pytest.mark.e2e

SUMMARY = "The agent is running the twelve scripted checks in order; each so far printed its log."


@pytest.fixture
def server() -> Iterator[GeminiUpstream]:
    started = GeminiUpstream(window=WINDOW, steps=STEPS, read_every=4, api_key=KEY).start()
    yield started
    started.stop()


@pytest.fixture
def summarizer() -> Iterator[FakeUpstream]:
    started = FakeUpstream().start()
    yield started
    started.stop()


def test_prepared_model_summaries_reach_the_view_and_the_key_stays_home(
    server: GeminiUpstream, summarizer: FakeUpstream, start_proxy: Any
) -> None:
    def summary(_: Recorded) -> Reply:
        return Reply(body=completion(SUMMARY, model="small-model"))

    summarizer.queue(*(Reply(dynamic=summary) for _ in range(40)))
    settings = {
        **config(server),
        "summarizer": {
            "kind": "openai",
            "model": "small-model",
            "base_url": summarizer.base_url,
            "prepare_at": 0.5,
        },
    }
    proxy = start_proxy(settings)
    run_agent(proxy.url, stream=True, run="summaries", key=KEY, task=TASK)
    headers = {"x-goog-api-key": KEY}
    events = httpx.get(proxy.base_url + "/compaction/events", headers=headers, timeout=10).json()["data"]
    made = [e for e in events if e.get("trigger") and e.get("summary")]
    prepared = [e["summary"].get("prepared") for e in made]
    assert made and "used" in prepared, prepared
    assert any(e["summary"].get("model") == "small-model" for e in made)
    # The summary went to the Gemini API in a view, as a text part.
    assert any(SUMMARY in json.dumps(s.body) for s in server.requests)
    # The summarizer never got the Gemini key, in any header or body.
    assert summarizer.requests and all(
        KEY not in str(r.raw_headers) + r.body.decode() for r in summarizer.requests
    )

    # The sessions list and the session page show the Gemini session.
    sessions = httpx.get(proxy.base_url + "/compaction/sessions", headers=headers, timeout=10).json()["data"]
    assert len(sessions) == 1, sessions
    listed = sessions[0]
    assert listed["door"] == "gemini" and listed["compaction_points"] >= 1 and listed["reads"] >= 1
    assert listed["tokens_upstream"] < listed["tokens_sent"], listed
    page = httpx.get(proxy.url + "/ui", timeout=10)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
