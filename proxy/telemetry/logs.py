"""Structured logs: one JSON object per line in production, readable lines in development.

Only names and numbers are logged. Message content, headers and keys never reach a log
call, so they cannot leak through one.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import orjson
import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure_logging(level: str = "info", fmt: str = "json", stream: Any = None) -> None:
    numeric = _LEVELS[level]
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if fmt == "json":
        structlog.configure(
            processors=[
                *shared,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(serializer=orjson.dumps),
            ],
            wrapper_class=structlog.make_filtering_bound_logger(numeric),
            logger_factory=structlog.BytesLoggerFactory(file=stream or sys.stdout.buffer),
            cache_logger_on_first_use=False,
        )
    else:
        structlog.configure(
            processors=[*shared, structlog.dev.ConsoleRenderer(colors=False)],
            wrapper_class=structlog.make_filtering_bound_logger(numeric),
            logger_factory=structlog.PrintLoggerFactory(file=stream or sys.stdout),
            cache_logger_on_first_use=False,
        )
    # uvicorn's own loggers: keep errors, drop its access log (ours is structured).
    logging.getLogger("uvicorn.access").disabled = True
    logging.getLogger("uvicorn.error").setLevel(max(numeric, logging.INFO))
