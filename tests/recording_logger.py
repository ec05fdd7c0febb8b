"""A structlog stand-in for tests: keeps each log call as a dict (the event and its fields)."""

from __future__ import annotations

from typing import Any


class RecordingLogger:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def bind(self, **_: Any) -> RecordingLogger:
        return self

    def info(self, event: str, **fields: Any) -> None:
        self.records.append({"event": event, **fields})

    warning = info
