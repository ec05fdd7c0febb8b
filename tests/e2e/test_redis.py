"""Redis for several replicas: the store contract on a real redis-server, and two proxy
processes sharing one session, a read on B of what A offloaded included."""

from __future__ import annotations

import re
from typing import Any

import openai
import pytest

from policies.ledger import Ledger
from policies.pipeline import Checkpoint, Offload
from policies.tokens import TokenCounter
from proxy.read_loop.commands import LoopLimits
from proxy.read_loop.store_reads import read_saved_output
from proxy.state.redis_store import RedisStore
from tests.e2e.test_read_tool_output import history, last_tool_result, read_first_handle
from tests.fake_upstream import FakeUpstream, Reply, completion

pytestmark = pytest.mark.e2e


async def test_redis_store_contract(redis_url: str) -> None:
    store = RedisStore(redis_url, keep_seconds=3600)
    output = Offload(handle="out_r1", content="\n".join(f"line {i}" for i in range(1, 51)), description="d")
    await store.put_outputs("t_a", [output])
    await store.put_outputs("t_a", [Offload(handle="out_r1", content="overwritten?", description="d")])
    found = await store.get_output("t_a", "out_r1")
    assert found is not None and found.content == output.content  # written once
    assert await store.get_output("t_b", "out_r1") is None
    result = await read_saved_output(
        store,
        "t_a",
        {"handle": "out_r1", "pattern": "^line 7$"},
        limits=LoopLimits(),
        room=10_000,
        counter=TokenCounter(),
        encoding="o200k_base",
    )
    text, outcome = result.text, result.outcome
    assert outcome == "ok" and "7| line 7" in text
    await store.client.delete("cpx:out:t_a:out_r1")  # as if its TTL ran out
    expired = await store.get_output("t_a", "out_r1")
    assert expired is not None and expired.expired
    checkpoint = Checkpoint(
        summary={"role": "user", "content": "s"}, covered=3, ledger=Ledger(goal="g"), requests=2
    )
    await store.save_checkpoint("t_a", "s_1:p", checkpoint)
    assert await store.load_checkpoint("t_a", "s_1:p") == checkpoint
    assert await store.load_checkpoint("t_b", "s_1:p") is None
    for i in range(3):
        await store.add_event(
            "t_a",
            f"s_{i % 2}:p",
            {"event_id": f"e{i}", "time": 100.0 + i, "session": f"s_{i % 2}:p", "policy": "p"},
        )
    assert [e["event_id"] for e in await store.events("t_a", session="s_0", since=100.0)] == ["e0", "e2"]
    assert await store.events("t_b") == []
    # The first secret kept is every replica's (compaction items verify on any of them).
    assert await store.secret("compaction_items", b"first") == b"first"
    assert await store.secret("compaction_items", b"second") == b"first"
    # A session's last send, swapped (the prompt clock of replicas); another tenant's is not it.
    assert await store.swap_sent_at("t_a", "s_1:p", 100.0) is None
    assert await store.swap_sent_at("t_a", "s_1:p", 1000.5) == 100.0
    assert await store.swap_sent_at("t_b", "s_1:p", 1001.0) is None
    await store.client.set("cpx:sent:s_2:p", b"t_a\x1fnot a time")
    assert await store.swap_sent_at("t_a", "s_2:p", 5.0) is None
    await store.close()


def test_two_replicas_share_one_session(start_proxy: Any, upstream: FakeUpstream, redis_url: str) -> None:
    config = {
        "policy": "improved",
        "context_windows": {"default": 8192},
        "store": {"backend": "redis", "redis_url": redis_url},
    }
    a, b = start_proxy(config), start_proxy(config)
    headers = {"x-session-id": "shared-run"}

    def client(proxy: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=proxy.base_url, api_key="sk-replicas-000000000000", max_retries=0)

    messages = history()
    upstream.queue(Reply(body=completion("from A")))
    client(a).chat.completions.create(model="m", messages=messages, extra_headers=headers)
    view_a = upstream.requests[-1].json()["messages"]
    handles = re.findall(r"handle=(out_[0-9a-f]+)", str(view_a))
    assert handles
    # B continues the session from the shared checkpoint, and reads what A offloaded.
    longer = [*messages, {"role": "assistant", "content": "Next."}, {"role": "user", "content": "Go on."}]
    upstream.queue(read_first_handle(pattern="SECRET"), Reply(body=completion("from B")))
    answer = client(b).chat.completions.create(model="m", messages=longer, extra_headers=headers)
    assert answer.choices[0].message.content == "from B"
    view_b = upstream.requests[-2].json()["messages"]
    assert view_b[: len(view_a)] == view_a
    assert "SECRET-LINE-42 ALPHA: value=1234" in last_tool_result(upstream.requests[-1])
    # And A again, alternating: still the same prefix.
    upstream.queue(Reply(body=completion("A again")))
    longer2 = [*longer, {"role": "assistant", "content": "Done."}, {"role": "user", "content": "More."}]
    client(a).chat.completions.create(model="m", messages=longer2, extra_headers=headers)
    assert upstream.requests[-1].json()["messages"][: len(view_a)] == view_a
