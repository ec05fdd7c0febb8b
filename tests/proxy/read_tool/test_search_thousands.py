"""A ``*`` search in a session with thousands of saved outputs: its work stays bounded (the
newest ``MAX_SEARCHED`` outputs, one store read each), it answers within its room, and it says
how many older outputs it did not search and how to reach them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from policies.pipeline import Offload
from policies.tokens import TokenCounter
from proxy.read_loop.commands import LoopLimits
from proxy.read_loop.store_reads import read_saved_output
from proxy.read_tool.search import MAX_SEARCHED
from proxy.state.sqlite_store import SQLiteStore

COUNTER = TokenCounter()
TENANT = "t_thousands"
SAVED = 3_000


def output(i: int) -> Offload:
    lines = [f"step {i} line {n}: worker pid={1000 + n} ready" for n in range(40)]
    return Offload(f"out_{i:016x}", "\n".join(lines), "log")


class CountingStore:
    """The real store, counting the saved outputs read."""

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store
        self.reads = 0

    async def get_output(self, tenant: str, handle: str) -> Any:
        self.reads += 1
        return await self.store.get_output(tenant, handle)


@pytest.fixture
async def store(tmp_path: Path) -> Any:
    store = SQLiteStore(tmp_path / "state" / "c.db")
    outputs = [output(i) for i in range(SAVED)]
    for start in range(0, SAVED, 500):
        await store.put_outputs(TENANT, outputs[start : start + 500])
    yield store
    await store.close()


async def test_a_search_over_thousands_of_outputs_reads_only_the_newest_and_says_so(store: Any) -> None:
    counting = CountingStore(store)
    started = time.monotonic()
    result = await read_saved_output(
        counting,  # type: ignore[arg-type]
        TENANT,
        {"handle": "*", "pattern": "pid=1007"},
        limits=LoopLimits(),
        room=1_500,
        counter=COUNTER,
        encoding="o200k_base",
        handles=tuple(f"out_{i:016x}" for i in range(SAVED)),
    )
    assert counting.reads == MAX_SEARCHED
    assert time.monotonic() - started < LoopLimits().timeout_seconds + 5
    text = result.text
    assert COUNTER.count_text(text, "o200k_base") <= 1_500
    # The newest output's match comes first; the older outputs are named as not searched.
    assert f"handle=out_{SAVED - 1:016x}" in text.splitlines()[1]
    assert f"[{SAVED - MAX_SEARCHED} older saved output(s) not searched" in text
    assert result.outcome == "truncated"
