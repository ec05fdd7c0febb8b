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

from proxy.events import EventSink


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
