"""Where a ``wrap`` run's events are: each run leaves a record in wrap's state directory (the
configuration its proxy ran and the directory that proxy worked in), so that
``compaction-proxy events --session wrap-...`` reads the right store from any directory."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path

import msgspec
import orjson

from proxy.commands.wrap_proxy import state_home
from proxy.config.settings import Settings, load_settings

SESSION_PREFIX = "wrap-"


def _record_path(home: Path, session: str) -> Path:
    return home / "runs" / f"{session}.json"


def record_run(
    home: Path, session: str, *, config: str | None, proxy_cwd: Path | None, proxy_url: str
) -> None:
    """The run's record: ``proxy_cwd`` is where a proxy started for the run worked (a relative
    ``state_dir`` resolves there); None for a shared proxy, whose directory wrap cannot know."""
    record = {
        "session": session,
        "config": str(Path(config).resolve()) if config else None,
        "proxy_cwd": str(proxy_cwd) if proxy_cwd else None,
        "proxy_url": proxy_url,
    }
    path = _record_path(home, session)
    # A record that cannot be written costs the events look-up from elsewhere, never the run.
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.write_bytes(orjson.dumps(record))


def _absolute(path: str, cwd: Path) -> str:
    return path if Path(path).is_absolute() else str(cwd / path)


def run_settings(session: str, env: Mapping[str, str]) -> tuple[Settings, str] | None:
    """The settings whose store holds a wrap run's events (its configuration, its relative
    paths resolved where its proxy worked), and words naming that store; None when
    ``session`` is no wrap run recorded here."""
    if not session.startswith(SESSION_PREFIX) or "/" in session:
        return None
    try:
        record = orjson.loads(_record_path(state_home(env), session).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    settings = load_settings(record.get("config"), env=env)
    cwd = record.get("proxy_cwd")
    if cwd:
        store = settings.store
        if store.path:
            store = msgspec.structs.replace(store, path=_absolute(store.path, Path(cwd)))
        settings = msgspec.structs.replace(
            settings, state_dir=_absolute(settings.state_dir, Path(cwd)), store=store
        )
    if settings.store.backend == "redis":
        where = "the Redis store"
    else:
        where = settings.store.path or str(Path(settings.state_dir) / "compaction.db")
    return settings, f"the store of wrap run {session} ({where})"
