"""Remote compaction answered by the proxy, end to end with the official openai SDK
(``client.responses.compact``) and raw requests: the compact endpoint and a
``compaction_trigger`` answered with one ``compaction`` item and no call upstream; the item put
back as the proxy's summary view in a later request; items forged, of another key, or unknown to
the store refused with a 400 that says why; ``compact.answer: relay`` relays as it came."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.test_responses_door import CONFIG, KEY, history, message, response
from tests.fake_upstream import FakeUpstream, Reply

pytestmark = pytest.mark.e2e

SECRET = "a-configured-secret-of-32-chars!"
TRIGGER = {"type": "compaction_trigger"}


def _sdk(proxy: Any, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key=key, max_retries=0)


def _post(proxy: Any, body: dict[str, Any], key: str = KEY, path: str = "/responses") -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"}
    return httpx.post(proxy.base_url + path, json=body, headers=headers, timeout=30)


def _metric(proxy: Any, result: str) -> float:
    text = httpx.get(proxy.base_url.rsplit("/v1", 1)[0] + "/metrics", timeout=10).text
    line = f'compaction_proxy_remote_compactions_total{{result="{result}"}} '
    return sum(float(row[len(line) :]) for row in text.splitlines() if row.startswith(line))


def test_the_sdks_compact_is_answered_and_its_item_put_back(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy({**CONFIG, "compact": {"secret": SECRET}})
    items = history()
    compacted = _sdk(proxy).responses.compact(model="gpt-5", input=items)  # type: ignore[arg-type]
    assert upstream.requests == []  # answered by the proxy
    assert compacted.object == "response.compaction"
    kinds = [(i.type, getattr(i, "role", None)) for i in compacted.output]
    assert kinds == [("message", "user"), ("compaction", None)]
    item = compacted.output[-1].model_dump(exclude_none=True)
    assert item["encrypted_content"].startswith("cpx1.cmp_")
    assert compacted.usage.input_tokens > compacted.usage.output_tokens > 0
    # The client goes on with what compact gave it: the upstream gets the summary view instead.
    upstream.queue(Reply(body=response([message("ok")])))
    follow = [*items[:1], *[i.model_dump(exclude_none=True, warnings=False) for i in compacted.output]]
    follow.append({"type": "message", "role": "user", "content": "Go on."})
    answer = _sdk(proxy).responses.create(model="gpt-5", input=follow, store=False)  # type: ignore[arg-type]
    assert answer.output_text == "ok"
    sent = upstream.requests[0].json()["input"]
    assert not [i for i in sent if i.get("type") == "compaction"]
    # The view of the forced point: its outputs saved behind handles (this history reaches the
    # policy's target without a summary), reasoning items exactly as they came.
    assert sum("[Output saved outside the context: handle=out_" in json.dumps(i) for i in sent) >= 5
    assert [i for i in sent if i.get("type") == "reasoning"] == [i for i in items if i["type"] == "reasoning"]
    assert sent[-1]["content"] == "Go on."
    assert _metric(proxy, "endpoint") == 1 and _metric(proxy, "expanded") == 1


@pytest.mark.parametrize("stream", [False, True])
def test_a_trigger_is_answered_with_exactly_one_compaction_item(
    start_proxy: Any, upstream: FakeUpstream, stream: bool
) -> None:
    proxy = start_proxy(CONFIG)
    answered = _post(proxy, {"model": "gpt-5", "input": [*history(), TRIGGER], "stream": stream})
    assert answered.status_code == 200, answered.text
    assert upstream.requests == []
    if stream:
        events = [json.loads(line[6:]) for line in answered.text.splitlines() if line.startswith("data: ")]
        done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
        final = events[-1]
        assert final["type"] == "response.completed"
    else:
        final = {"response": answered.json()}
        done = final["response"]["output"]
    assert [i["type"] for i in done] == ["compaction"]
    assert final["response"]["output"] == done and final["response"]["usage"]["input_tokens"] > 0
    assert answered.headers["x-compaction-trigger"] == "forced"
    assert _metric(proxy, "trigger") == 1
    # Recorded like any compaction point (events are written in batches: read until it is there).
    events: list[dict[str, Any]] = []
    for _ in range(100):
        events = httpx.get(
            proxy.base_url + "/compaction/events", headers={"authorization": f"Bearer {KEY}"}
        ).json()["data"]
        if events:
            break
        time.sleep(0.05)
    assert events and events[-1]["trigger"] == "forced", events
    assert events[-1]["dialect_notes"]["remote_compaction"]["answered"] == "trigger"


def test_items_forged_foreign_or_unknown_are_refused(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy({**CONFIG, "compact": {"secret": SECRET}})
    item = _post(proxy, {"model": "gpt-5", "input": [*history(), TRIGGER]}).json()["output"][0]
    user = {"type": "message", "role": "user", "content": "Go on."}
    forged = {**item, "encrypted_content": item["encrypted_content"][:-2] + "xx"}
    openai_own = {**item, "encrypted_content": "gAAAAABopaque"}
    cases = [
        (forged, KEY, "does not verify for this API key"),
        (item, "sk-another-key-000000000000", "does not verify for this API key"),
        (openai_own, KEY, "was not made by this proxy"),
    ]
    for sent, key, why in cases:
        refused = _post(proxy, {"model": "gpt-5", "input": [sent, user]}, key=key)
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["code"] == "invalid_compaction_item" and why in error["message"], error
    # Another proxy with the same secret and its own store: the item verifies, its record is not there.
    other = start_proxy({**CONFIG, "compact": {"secret": SECRET}})
    unknown = _post(other, {"model": "gpt-5", "input": [item, user]})
    assert unknown.status_code == 400 and "does not have" in unknown.json()["error"]["message"]
    assert upstream.requests == []
    assert _metric(proxy, "refused") == 3


def test_relay_sends_compaction_as_it_came(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy({**CONFIG, "compact": {"answer": "relay"}})
    body = {"model": "gpt-5", "input": history(2)}
    relayed = _post(proxy, body, path="/responses/compact")
    assert relayed.json()["echo"]["path"] == "/v1/responses/compact"
    assert upstream.requests[0].json() == body
    upstream.queue(Reply(body=response([message("ok")])))
    assert _post(proxy, {**body, "input": [*history(2), TRIGGER]}).status_code == 200
    assert upstream.requests[1].json()["input"][-1] == TRIGGER  # the upstream decides what it means
