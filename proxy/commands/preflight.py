"""Checks ``serve`` runs before anything starts, so an expected fault is one clear line and a
non-zero exit instead of a traceback (or a ``started`` line followed by a failure): the
listen address is free, the state directory is writable, the store is reachable.

The choice for dependencies that are down at start is to stop (exit 1) rather than start
degraded: a proxy that cannot keep saved outputs would have to send every request
uncompacted, and the orchestrator (systemd, compose's ``restart``, Kubernetes) restarts it
once the dependency is back. Faults after the start fail open instead (see the README's
"When things fail").
"""

from __future__ import annotations

import errno
import os
import socket
import sqlite3
import stat
import tempfile
from pathlib import Path

from proxy.config.settings import Settings
from proxy.state.store_factory import redact_url


class PreflightError(RuntimeError):
    """Something ``serve`` needs is missing; the message says what and how to fix it."""


def check_listen(host: str, port: int) -> None:
    """Bind the address once and let it go, so that a port in use is reported before start."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise PreflightError(
            f"cannot listen on {host}:{port}: the host name does not resolve ({exc.strerror}); "
            "set server.host (or --host) to an address such as 127.0.0.1 or 0.0.0.0"
        ) from exc
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        # As uvicorn binds: a port left in TIME_WAIT by a previous run is not "in use".
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise PreflightError(_bind_advice(host, port, exc)) from exc


def _bind_advice(host: str, port: int, exc: OSError) -> str:
    where = f"cannot listen on {host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"{where}: the address is already in use (another process listens there; "
            f"`ss -ltnp 'sport = :{port}'` shows which). Stop it, or choose another port "
            "with --port, COMPACTION_PROXY_PORT or server.port"
        )
    if exc.errno == errno.EACCES:
        return f"{where}: permission denied (ports below 1024 need privileges); choose a port of 1024 or more"
    if exc.errno == errno.EADDRNOTAVAIL:
        return (
            f"{where}: this machine has no such address; use 127.0.0.1 (this machine only) "
            "or 0.0.0.0 (every interface) with --host, COMPACTION_PROXY_HOST or server.host"
        )
    return f"{where}: {exc.strerror or exc}"


# Files of the state directory the proxy opens by name (a link there would be followed).
STATE_FILES = ("compaction.db", "compaction.db-wal", "compaction.db-shm", "token_factors.json")


def check_state_dir(path: str) -> None:
    """The state directory exists (created owner-only), this user can write in it, and no one
    else can: it holds every saved output and event, so a directory another user could write
    in (group- or world-writable, or owned by another user) would let them replace the
    database or plant a link in its place. A symlinked state directory is followed; the
    directory it points to must pass the same checks. Its files must not be links."""
    state = Path(path)
    try:
        state.mkdir(parents=True, exist_ok=True, mode=0o700)
        with tempfile.NamedTemporaryFile(dir=state, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise PreflightError(
            f"the state directory {state.resolve()} is not writable ({exc.strerror or exc}); "
            f"set state_dir to a directory user {os.getuid()} can write"
        ) from exc
    resolved = state.resolve()
    info = resolved.stat()
    if info.st_uid != os.geteuid():
        raise PreflightError(
            f"the state directory {resolved} belongs to user {info.st_uid}, not to user "
            f"{os.geteuid()} that runs the proxy; use a directory of its own (chown it, or set state_dir)"
        )
    if info.st_mode & 0o022:
        raise PreflightError(
            f"the state directory {resolved} can be written by other users (mode "
            f"{stat.S_IMODE(info.st_mode):o}): they could replace the database; chmod 700 {resolved}"
        )
    for name in STATE_FILES:
        if (resolved / name).is_symlink():
            raise PreflightError(
                f"{resolved / name} is a symbolic link; the proxy writes its state files itself: "
                "remove the link (or point state_dir at the directory it led to)"
            )


def check_sqlite_file(path: Path) -> None:
    """An existing database file must open as SQLite: a corrupt one stops the start with one
    line saying how to go on (it is never set aside silently: its outputs may be recoverable)."""
    if not path.exists():
        return
    try:
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
        try:
            connection.execute("PRAGMA schema_version").fetchone()
            connection.execute("SELECT count(*) FROM sqlite_master").fetchone()
        finally:
            connection.close()
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            return  # another process holds it: the store waits, and fails open, at run time
        raise PreflightError(_corrupt(path, exc)) from exc
    except sqlite3.DatabaseError as exc:
        raise PreflightError(_corrupt(path, exc)) from exc


def _corrupt(path: Path, exc: Exception) -> str:
    return (
        f"the SQLite store {path.resolve()} cannot be read ({exc}); move it aside "
        f"(mv {path} {path}.corrupt) to start with an empty store, or restore it from a backup"
    )


def check_store(settings: Settings, timeout: float = 3.0) -> None:
    store = settings.store
    if store.backend == "sqlite":
        if store.path:
            check_state_dir(str(Path(store.path).parent))
        check_sqlite_file(Path(store.path) if store.path else Path(settings.state_dir) / "compaction.db")
        return
    import redis

    client = redis.Redis.from_url(store.redis_url, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        client.ping()
    except redis.RedisError as exc:
        reason = str(exc).split(". ")[0].strip() or type(exc).__name__
        if isinstance(exc, redis.AuthenticationError | redis.ResponseError):
            reason = "authentication failed" if isinstance(exc, redis.AuthenticationError) else reason
        raise PreflightError(
            f"the Redis store at {redact_url(store.redis_url)} is not reachable ({reason}); "
            "start Redis, or fix store.redis_url (store.backend: sqlite needs no server)"
        ) from exc
    finally:
        client.close()


def preflight(settings: Settings) -> None:
    check_listen(settings.server.host, settings.server.port)
    check_state_dir(settings.state_dir)
    check_store(settings)


def readiness_url(settings: Settings) -> str:
    """Where this configuration's proxy answers /readyz, from the same machine."""
    host = settings.server.host
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{settings.server.port}/readyz"


def healthcheck(settings: Settings, timeout: float = 2.0) -> tuple[bool, str]:
    import urllib.error
    import urllib.request

    url = readiness_url(settings)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:  # noqa: S310 (http only)
            return answer.status == 200, f"{url}: {answer.status}"
    except urllib.error.HTTPError as exc:
        return False, f"{url}: {exc.code} (starting, or the store is not ready)"
    except OSError as exc:
        reason = getattr(exc, "reason", None) or exc
        return False, f"{url}: not answering ({reason})"
