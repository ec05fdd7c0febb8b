"""The store a configuration asks for (SQLite on this machine, or Redis shared by replicas),
and how it is named for humans."""

from __future__ import annotations

from pathlib import Path

from proxy.commands.preflight import redact_url
from proxy.config.settings import Settings
from proxy.state.store import SQLiteStore, Store


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
