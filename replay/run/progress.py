"""A progress bar on stderr (rich), silent when disabled or when stderr is not a terminal."""

from __future__ import annotations

import sys
from typing import Any


class Progress:
    def __init__(self, total: int, description: str = "replaying", enabled: bool = True) -> None:
        self._bar: Any = None
        self._task: Any = None
        if enabled and sys.stderr.isatty():
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(description, total=total)

    def advance(self, steps: int = 1) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, steps)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
