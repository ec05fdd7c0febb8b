"""The processes of a benchmark run: starting them, reading their CPU, stopping them.

Every process is started here and remembered, so that the driver can stop each one by its
own PID at the end, whatever happened (error, Ctrl-C, SIGTERM). CPU is read from
``/proc/PID/stat`` for a process and its descendants, so a proxy with worker processes is
charged for all of them.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def http_call(port: int, method: str, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """A small control request (readiness, upstream counters) to 127.0.0.1.

    ``http.client`` rather than ``urllib``: it never routes through an ``http_proxy``.
    """
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def answers(port: int, path: str) -> bool:
    try:
        return http_call(port, "GET", path, timeout=1.0)[0] == 200
    except OSError:
        return False


class Processes:
    """Every process this run starts. Children get their own session: a Ctrl-C reaches the
    driver only, which then stops them in order instead of racing their signal handlers."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: list[subprocess.Popen[bytes]] = []

    def start(
        self,
        name: str,
        argv: list[str],
        ready: Callable[[], bool],
        env: dict[str, str] | None = None,
        cwd: Path = ROOT,
    ) -> int:
        """Start ``argv`` with its output in ``TMP/NAME.log``; wait until ``ready()``."""
        log_path = self.tmp / f"{name}.log"
        with log_path.open("ab") as out:
            proc = subprocess.Popen(
                argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self.started.append(proc)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log_path.read_text()[-2000:]}")
            if ready():
                return proc.pid
            time.sleep(0.05)
        raise RuntimeError(f"{name} not ready after 60 s:\n{log_path.read_text()[-2000:]}")

    def start_upstream(self, port: int, chunks: int, chunk_interval_ms: float, delay_ms: float) -> int:
        """The fake upstream; ready once it has printed that it listens (a 200 on the port
        could come from another server that already holds it)."""
        argv = [sys.executable, str(HERE / "fake_upstream.py"), "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--chunks", str(chunks), "--chunk-interval-ms", str(chunk_interval_ms)]
        argv += ["--delay-ms", str(delay_ms)]
        log_path = self.tmp / "fake_upstream.log"
        return self.start("fake_upstream", argv, lambda: b"listening on" in log_path.read_bytes())

    def start_proxy(
        self,
        upstream_port: int,
        extra_config: dict[str, object] | None = None,
        root: Path = ROOT,
        name: str = "proxy",
    ) -> tuple[int, int]:
        """The proxy as users run it, with a temporary config; returns (port, pid). ``root``:
        the checkout whose code runs (``python -m`` imports from its working directory first),
        so two commits can be measured side by side in one run."""
        port = free_port()
        config = {
            "upstream": {"base_url": f"http://127.0.0.1:{upstream_port}/v1"},
            "logging": {"level": "warning", "format": "json"},
            "state_dir": str(self.tmp / f"state-{name}"),
            **(extra_config or {}),
        }
        config_path = self.tmp / f"{name}.yml"
        config_path.write_text(json.dumps(config, indent=2))  # JSON is valid YAML
        # The developer's COMPACTION_PROXY_* variables would override the temporary config.
        env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_PROXY_")}
        argv = [sys.executable, "-m", "proxy.cli", "serve", "--config", str(config_path), "--port", str(port)]
        return port, self.start(name, argv, lambda: answers(port, "/readyz"), env, cwd=root)

    def stop(self, pid: int) -> None:
        """SIGTERM one process this run started, by its PID (SIGKILL after 10 s)."""
        for proc in self.started:
            if proc.pid == pid:
                _terminate(proc)

    def stop_all(self) -> None:
        """SIGTERM each process by PID, newest first; SIGKILL what does not exit in 10 s."""
        for proc in reversed(self.started):
            _terminate(proc)


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def tree_ticks(root: int) -> int:
    """CPU clock ticks (user + system) of ``root`` and all its descendants, including the
    children they have already reaped."""
    table: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        fields = raw[raw.rfind(b")") + 2 :].split()  # the command name may contain spaces
        # After the name: state, ppid, ..., then utime, stime, cutime, cstime (fields 14-17).
        table[int(entry)] = (int(fields[1]), sum(int(v) for v in fields[11:15]))
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    total, stack, seen = 0, [root], set()
    while stack:
        pid = stack.pop()
        if pid in table and pid not in seen:
            seen.add(pid)
            total += table[pid][1]
            stack += children.get(pid, [])
    return total


def settle(pid: int | None, max_wait: float = 10.0) -> None:
    """Wait until a target is idle: a proxy can still be finishing requests wrk abandoned,
    and that work must not be charged to the next measurement."""
    if pid is None:
        time.sleep(0.2)
        return
    deadline = time.monotonic() + max_wait
    previous = tree_ticks(pid)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        current = tree_ticks(pid)
        if current - previous <= 1:
            return
        previous = current
