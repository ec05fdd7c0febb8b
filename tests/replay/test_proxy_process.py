"""The proxy as a child process: a port taken between choosing it and binding it (parallel
test workers do that) costs a restart on another port, not a failed test."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx

from replay.session.proxy_process import ProxyProcess


def test_a_port_taken_before_the_proxy_binds_it_is_replaced(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        proxy = ProxyProcess({"state_dir": str(tmp_path / "state")}, tmp_path)
        proxy.port = busy
        proxy.start()
        try:
            assert proxy.port != busy
            assert httpx.get(proxy.url + "/healthz", timeout=5, trust_env=False).status_code == 200
        finally:
            proxy.stop()
        assert b"already in use" in proxy.log_path.read_bytes()
