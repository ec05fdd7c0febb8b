"""The proxy a replay starts for itself: ``compaction-proxy serve`` as a child process.

Its configuration is the user's proxy configuration (the arms are its policies) with every
upstream (OpenAI's, Anthropic's, the Gemini API's and Code Assist's) pointed at the recorded
upstream, its state in the run directory, and, when the run
forces one, a single context window for every model.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from proxy.config.settings import Settings, to_builtins
from replay.config import ReplayConfig


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def replay_proxy_config(
    settings: Settings, config: ReplayConfig, upstream_url: str, state_dir: Path
) -> dict[str, Any]:
    data = to_builtins(settings)
    # The recorded upstream knows no window: the replay measures at the window it is given.
    data["upstream"] = {**data["upstream"], "base_url": upstream_url, "api_key": None, "learn_windows": False}
    data["anthropic"] = {"base_url": upstream_url, "api_key": None}
    # Google's base URLs are the API's root (a client's path holds the version): every door, the
    # Gemini API's and Code Assist's too, goes to the recorded upstream, never to Google.
    root = upstream_url.rstrip("/").removesuffix("/v1")
    data["gemini"] = {"base_url": root, "api_key": None, "code_assist_url": root}
    data["state_dir"] = str(state_dir)
    data["server"] = {**data["server"], "admin_token": None, "workers": 1, "host": "127.0.0.1"}
    data["store"] = {**data["store"], "path": None} if data["store"]["backend"] == "sqlite" else data["store"]
    data["events"] = {**data["events"], "jsonl_path": None, "record_skipped": config.mode == "shadow"}
    data["logging"] = {"level": "warning", "format": "json"}
    # The replay's simulated time (its idle model) is the proxy's clock: each step says its time.
    # The cache the proxy times by is the one the run is billed by: its lifetime and prices.
    _, _, prices = config.run_prices()
    door = {"anthropic": "anthropic", "gemini": "gemini", "code_assist": "gemini"}.get(
        config.dialect, "openai"
    )
    provider = {
        "ttl_seconds": config.cache.ttl_seconds,
        "read_price": prices.cached_input,
        "write_price": max(prices.cache_write, 1.0),
    }
    data["prompt_cache"] = {**data["prompt_cache"], "clock": "request", door: provider}
    if config.context_window is not None:
        data["context_windows"] = {"default": config.context_window}
    if config.summarizer_model is not None:
        data["summarizer"] = {
            **data["summarizer"],
            "kind": "openai",
            "base_url": config.summarizer_model.base_url,
            "model": config.summarizer_model.model,
            "api_key": None,
            # The replay's every client is the operator's own: the summarizer model's key (set
            # in the environment) pays for the replay's summaries, whatever key the harness sends.
            "api_key_pays_for": "every_client",
            "timeout": config.summarizer_model.timeout,
        }
    else:
        data["summarizer"] = {**data["summarizer"], "kind": "ledger"}
    return data


class ProxyProcess:
    """``compaction-proxy serve`` as a child process on a free loopback port, with its config
    and log in ``workdir``; stopped by its PID. (The end-to-end tests start theirs with it.)"""

    def __init__(
        self,
        config: dict[str, Any],
        workdir: Path,
        env: dict[str, str] | None = None,
        config_name: str = "proxy-config.yml",
    ) -> None:
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / config_name
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = workdir / "proxy.log"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_PROXY_")}
        self.env.update(env or {})
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def start(self, timeout: float = 30.0, attempts: int = 3) -> None:
        """Start and wait for ``/readyz``. A free port can be taken by another process between
        choosing it and binding it (parallel test workers do that): the proxy is then started
        again on another port, up to ``attempts`` times."""
        for attempt in range(attempts):
            logged = self.log_path.stat().st_size if self.log_path.exists() else 0
            try:
                self._start_once(timeout)
                return
            except RuntimeError:
                since = self.log_path.read_bytes()[logged:] if self.log_path.exists() else b""
                if b"already in use" not in since or attempt == attempts - 1:
                    raise
                self.port = free_port()

    def _start_once(self, timeout: float) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "proxy.cli",
                    "serve",
                    "--config",
                    str(self.config_path),
                    "--port",
                    str(self.port),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the proxy exited with {self.process.returncode}: {self.log_path.read_text()[-3000:]}"
                )
            try:
                if httpx.get(self.url + "/readyz", timeout=1, trust_env=False).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the proxy did not become ready: {self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
