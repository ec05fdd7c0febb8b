"""A real redis-server (Debian's package) on a loopback port, started and stopped by PID:
the shared one of the Redis suite, and the ones the outage tests stop and start again."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from tests.fake_upstream import free_port
from tests.needs import service_binary


def start(port: int, directory: Path, *, persistent: bool = False) -> subprocess.Popen[bytes]:
    """Start redis-server on ``127.0.0.1:port`` with its files in ``directory`` and wait until
    it answers ``PING``. ``persistent``: an append-only file synced on every write, so what
    was stored survives a restart on the same directory."""
    binary = service_binary("redis-server")
    persistence = ["--appendonly", "yes", "--appendfsync", "always"] if persistent else ["--appendonly", "no"]
    process = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            *persistence,
            "--dir",
            str(directory),
            "--protected-mode",
            "yes",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as connection:
                connection.sendall(b"PING\r\n")
                if connection.recv(16).startswith(b"+PONG"):
                    return process
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"redis-server did not answer on port {port}")


def start_on_a_free_port(directory: Path, *, persistent: bool = False) -> tuple[subprocess.Popen[bytes], int]:
    """``start`` on a free port, choosing again when another process took it first."""
    for attempt in range(3):
        port = free_port()
        try:
            return start(port, directory, persistent=persistent), port
        except RuntimeError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
