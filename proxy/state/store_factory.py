"""The store a configuration asks for (SQLite on this machine, or Redis shared by replicas),
and how it is named for humans."""

from __future__ import annotations

import urllib.parse
from pathlib import Path

from proxy.config.settings import Settings
from proxy.state.sqlite_store import SQLiteStore
from proxy.state.store import Store


def describe_store(settings: Settings) -> str:
    """The store for humans: its kind and where it is (a Redis password never shown)."""
    if settings.store.backend == "redis":
        return f"redis {redact_url(settings.store.redis_url)}"
    return f"sqlite {settings.store.path or Path(settings.state_dir) / 'compaction.db'}"


def make_store(settings: Settings) -> Store:
    if settings.store.backend == "redis":
        from proxy.state.redis_store import RedisStore

        return RedisStore(
            settings.store.redis_url,
            settings.store.keep_days * 86_400,
            timeout=settings.store.redis_timeout_seconds,
        )
    return SQLiteStore(
        settings.store.path or Path(settings.state_dir) / "compaction.db",
        busy_timeout=settings.store.busy_timeout_seconds,
        event_linger=settings.store.event_batch_seconds,
    )


def redact_url(url: str) -> str:
    """A store or upstream URL without its password, for messages and logs."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = (parts.username or "") + ":***@" + (parts.hostname or "")
    if parts.port:
        netloc += f":{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
