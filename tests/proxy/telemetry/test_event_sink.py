"""The event sink's file on a disk that runs out of room mid-line: the half line is taken
back, the failure counted, and the store still gets the event."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.telemetry.events import EventSink


class Store:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def add_event(
        self, tenant: str, session: str, event: dict[str, Any], checkpoint: object = None
    ) -> None:
        self.events.append(event)


def test_a_line_the_disk_has_no_room_for_is_taken_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "events.jsonl"
    store, failures = Store(), []
    sink = EventSink(store, str(path), on_failure=lambda: failures.append(1))  # type: ignore[arg-type]
    event = {"tenant": "t_a", "session": "s", "event_id": "ev_1", "view": "x" * 10_000}

    async def write(count: int) -> None:
        for n in range(count):
            sink.emit({**event, "event_id": f"ev_{n}"})
        await sink.drain()

    asyncio.run(write(1))
    real_write = os.write

    def half_then_full(descriptor: int, data: bytes) -> int:
        if len(data) > 5_000:
            return real_write(descriptor, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    asyncio.run(write(2))
    monkeypatch.setattr(os, "write", real_write)
    asyncio.run(write(1))
    lines = path.read_bytes().splitlines()
    assert [orjson.loads(line)["event_id"] for line in lines] == ["ev_0", "ev_0"]
    assert len(failures) == 2 and len(store.events) == 4


class BatchingStore(Store):
    """Takes events into a batch written at the next turn of the loop (as the SQLite store
    does within its linger), failing if told to."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.fail = fail
        self.batch: asyncio.Future[None] | None = None

    def queue_event(
        self, tenant: str, session: str, event: dict[str, Any], checkpoint: object = None
    ) -> asyncio.Future[None]:
        self.events.append(event)
        if self.batch is None or self.batch.done():
            loop = asyncio.get_running_loop()
            self.batch = loop.create_future()
            loop.call_soon(self._written, self.batch)
        return self.batch

    def _written(self, batch: asyncio.Future[None]) -> None:
        if self.fail:
            batch.set_exception(OSError("disk I/O error"))
        else:
            batch.set_result(None)


def test_a_batching_store_takes_each_event_without_a_task() -> None:
    async def run() -> tuple[int, int]:
        store = BatchingStore()
        sink = EventSink(store, None)  # type: ignore[arg-type]
        before = len(asyncio.all_tasks())
        for n in range(50):
            sink.emit({"tenant": "t", "session": "s", "event_id": f"ev_{n}"})
        during = len(asyncio.all_tasks()) - before
        await sink.drain()
        assert not sink.pending
        return during, len(store.events)

    assert asyncio.run(run()) == (0, 50)


def test_each_event_of_a_batch_that_failed_is_counted() -> None:
    failures: list[int] = []

    async def run() -> None:
        sink = EventSink(BatchingStore(fail=True), None, on_failure=lambda: failures.append(1))  # type: ignore[arg-type]
        for n in range(5):
            sink.emit({"tenant": "t", "session": "s", "event_id": f"ev_{n}"})
        await sink.drain()
        await asyncio.sleep(0)  # the failures are counted by the batch's callbacks

    asyncio.run(run())
    assert len(failures) == 5
