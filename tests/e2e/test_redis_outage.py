"""Redis going away in the middle of traffic and coming back (a real redis-server, stopped
and started again on the same port and files): requests go on uncompacted meanwhile, each
answered within about a second whether Redis is gone (connection refused) or hung (stopped
with SIGSTOP: connected, never answering); afterwards the sessions compact again, what was
stored before is read back, and no event recorded before is lost."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests import redis_server
from tests.e2e.test_read_tool_output import HANDLE, history, last_tool_result, read_call
from tests.fake_upstream import FakeUpstream, Recorded, Reply, completion

pytestmark = pytest.mark.e2e

KEY = "sk-redis-outage-00000000000"
# A request while Redis is away must not wait for it much longer than this.
ANSWERED_WITHIN_SECONDS = 2.0


class Redis:
    """One redis-server that can be killed, frozen and started again on its port and files."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(exist_ok=True)
        self.process, self.port = redis_server.start_on_a_free_port(directory, persistent=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        redis_server.stop(self.process)

    def restart(self) -> None:
        self.process = redis_server.start(self.port, self.directory, persistent=True)


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[Redis]:
    server = Redis(tmp_path / "redis")
    yield server
    if server.process.poll() is None:
        os.kill(server.process.pid, signal.SIGCONT)
        server.stop()


def chat(proxy: Any, messages: list[Any], session: str) -> tuple[Any, float]:
    client = openai.OpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0, timeout=30)
    started = time.monotonic()
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=messages, extra_headers={"x-session-id": session}
    )
    return raw, time.monotonic() - started


def session_events(proxy: Any, session: str, at_least: int) -> list[Any]:
    """The session's events once ``at_least`` are stored: events are written in the background
    after the answer, so the last request's may land a moment after its response."""
    deadline = time.monotonic() + 10
    while True:
        events: list[Any] = httpx.get(
            proxy.base_url + "/compaction/events",
            params={"session": session},
            headers={"authorization": f"Bearer {KEY}"},
            timeout=10,
        ).json()["data"]
        if len(events) >= at_least or time.monotonic() > deadline:
            return events
        time.sleep(0.1)


def longer(messages: list[Any], turn: int) -> list[Any]:
    step = {"role": "assistant", "content": f"Step {turn}."}
    return [*messages, step, {"role": "user", "content": "Go on."}]


def test_requests_go_on_while_redis_is_away_and_stored_work_is_back_after(
    start_proxy: Any, upstream: FakeUpstream, redis: Redis
) -> None:
    proxy = start_proxy(
        {
            "policy": "improved",
            "context_windows": {"default": 8192},
            "store": {"backend": "redis", "redis_url": redis.url},
        }
    )
    messages = history()
    upstream.queue(Reply(body=completion("compacted")))
    raw, _ = chat(proxy, messages, "run-1")
    assert raw.headers["x-compaction-trigger"] == "threshold"
    handles = HANDLE.findall(upstream.requests[-1].body.decode())
    assert handles
    # Recorded before the outage: the event is written in the background after the answer.
    assert session_events(proxy, "run-1", at_least=1)

    # Gone (connection refused): answered at once, the client's own messages sent upstream.
    redis.stop()
    for turn in range(3):
        messages = longer(messages, turn)
        upstream.queue(Reply(body=completion(f"while gone {turn}")))
        raw, took = chat(proxy, messages, "run-1")
        assert raw.parse().choices[0].message.content == f"while gone {turn}"
        assert took < ANSWERED_WITHIN_SECONDS, f"request {turn} waited {took:.1f} s for a stopped Redis"
        assert upstream.requests[-1].json()["messages"] == messages

    # Hung (SIGSTOP: the connection is open and never answers): bounded by the store timeout.
    redis.restart()
    os.kill(redis.process.pid, signal.SIGSTOP)
    for turn in range(3, 5):
        messages = longer(messages, turn)
        upstream.queue(Reply(body=completion(f"while hung {turn}")))
        raw, took = chat(proxy, messages, "run-1")
        assert raw.parse().choices[0].message.content == f"while hung {turn}"
        assert took < ANSWERED_WITHIN_SECONDS, f"request {turn} waited {took:.1f} s for a hung Redis"
    os.kill(redis.process.pid, signal.SIGCONT)

    # Back: what was stored before the outage is read back, the session compacts again.
    time.sleep(1.5)  # past the store's pause after a failure

    def read_earlier(_request: Recorded) -> Reply:
        return Reply(body=completion(tool_calls=[read_call({"handle": handles[0], "pattern": "SECRET"})]))

    messages = longer(messages, 5)
    upstream.queue(Reply(dynamic=read_earlier), Reply(body=completion("found 1234")))
    raw, _ = chat(proxy, messages, "run-1")
    assert raw.parse().choices[0].message.content == "found 1234"
    assert "SECRET-LINE-42 ALPHA: value=1234" in last_tool_result(upstream.requests[-1])
    # The session's checkpoint from before the outage applies again: compacted.
    assert int(raw.headers["x-compaction-tokens-after"]) < int(raw.headers["x-compaction-tokens-before"]) / 2
    events = session_events(proxy, "run-1", at_least=2)
    assert len(events) >= 2 and any(set(handles) <= set(e.get("handles_offloaded", [])) for e in events)
