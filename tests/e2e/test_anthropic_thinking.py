"""Thinking through the Messages door, as Claude's API checks it: the read rounds a client never
saw are put back where they happened when it echoes the answer (so its thinking comes back in
the message it was written in, after what it was written after), and for models whose thinking
is bound to the conversation before it, a request the proxy changed asks the API to drop stale
blocks instead of refusing them."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.anthropic_protocol import problems
from tests.e2e.test_anthropic_door import (
    CONFIG,
    KEY,
    TOOLS,
    history,
    message,
    reads_first_handle,
    recorded_events,
    thinking,
)
from tests.fake_upstream import FakeUpstream, Reply

pytestmark = pytest.mark.e2e


def post(proxy: Any, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(proxy.url + "/v1/messages", json=body, headers={"x-api-key": KEY, **headers})


@pytest.mark.parametrize("echo_is_large", [False, True])
def test_the_rounds_a_client_never_saw_come_back_when_it_echoes_the_answer(
    start_proxy: Any, upstream: FakeUpstream, echo_is_large: bool
) -> None:
    """Whatever the echoing request's size: a large one (here: more messages than the limit) is
    read by a worker process, which asks this process for the rounds it keeps."""
    # history() holds 21 messages and the echo 23: over 22, only the echo is large.
    proxy = start_proxy({**CONFIG, "server": {"large_request_messages": 22}} if echo_is_large else CONFIG)
    call = {
        "type": "tool_use",
        "id": "toolu_next",
        "name": "Bash",
        "input": {"command": "grep -n 4242 f0.py"},
    }
    final = [thinking("now grep"), call]
    upstream.queue(Reply(dynamic=reads_first_handle), Reply(body=message(final, usage=50)))
    body = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 1024,
        "messages": history(),
        "tools": TOOLS,
        "thinking": {"type": "enabled", "budget_tokens": 512},
    }
    answer = post(proxy, body).json()
    assert answer["content"] == final  # the client sees the last round only
    hidden_round = upstream.requests[1].json()["messages"][-2:]  # the read call and its result
    # The client echoes the answer and runs the call.
    result = {
        "type": "tool_result",
        "tool_use_id": "toolu_next",
        "content": "f0.py:42: SECRET-LINE value=4242",
    }
    echoed = {
        **body,
        "messages": [
            *body["messages"],
            {"role": "assistant", "content": answer["content"]},
            {"role": "user", "content": [result]},
        ],
    }
    upstream.queue(Reply(body=message([thinking("done"), {"type": "text", "text": "Fixed."}])))
    assert post(proxy, echoed).status_code == 200
    sent = upstream.requests[-1].json()
    assert problems(sent) == []
    # Upstream, the answer follows the round it was written after, exactly as written.
    tail = sent["messages"][-4:]
    assert tail[:2] == hidden_round
    assert tail[2] == {"role": "assistant", "content": final}
    assert tail[3] == {"role": "user", "content": [result]}
    events = recorded_events(proxy, 2)
    restored = [e for e in events if (e.get("dialect_notes") or {}).get("restored_read_rounds") == 1]
    assert len(restored) == 1
    assert bool((restored[0].get("details") or {}).get("large_request")) == echo_is_large


def test_bound_thinking_models_get_stale_blocks_dropped_not_refused(
    start_proxy: Any, upstream: FakeUpstream
) -> None:
    proxy = start_proxy(CONFIG)
    upstream.queue(Reply(dynamic=reads_first_handle), Reply(body=message([{"type": "text", "text": "ok"}])))
    body = {"model": "claude-sonnet-5-5", "max_tokens": 1024, "messages": history(), "tools": TOOLS}
    assert post(proxy, body, **{"anthropic-beta": "interleaved-thinking-2025-05-14"}).status_code == 200
    for request in upstream.requests:
        sent = request.json()
        # The history and tools changed (a compaction, the read tool): thinking blocks bound to
        # the old ones are dropped by the API, which defaults these models to adaptive thinking.
        assert sent["thinking"] == {
            "type": "adaptive",
            "block_binding": {"prefix_mismatch_behavior": "drop_block"},
        }
        assert (
            request.headers["anthropic-beta"]
            == "interleaved-thinking-2025-05-14,thinking-binding-controls-2026-08-01"
        )
    # A model without bound thinking is left as the client sent it.
    upstream.queue(Reply(dynamic=reads_first_handle), Reply(body=message([{"type": "text", "text": "ok"}])))
    assert post(proxy, {**body, "model": "claude-sonnet-4-6"}).status_code == 200
    assert "thinking" not in upstream.requests[-1].json()
    assert "anthropic-beta" not in upstream.requests[-1].headers
