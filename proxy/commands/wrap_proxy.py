"""The proxy a ``wrap`` run goes through: found and verified, or started for the run, and stopped.

An agent's key goes only to a proxy that says it is compaction-proxy on ``/readyz`` and, unless
the user named it with ``--url``, runs the very configuration wrap was given (equal
``config_digest``, a digest of the resolved settings without secrets). This is identification
on a loopback address, not authentication: it stops wrap from silently using another
configuration's proxy, or anything else that answers 200 at that port.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from proxy.commands.preflight import readiness_url
from proxy.config.settings import Settings, settings_digest

SERVICE = "compaction-proxy"
READY_SECONDS = 30.0


class WrapRefused(RuntimeError):
    """wrap will not run the agent: the message is one line for the user."""


@dataclass(frozen=True)
class Identity:
    """What a compaction-proxy says of itself on ``/readyz`` (no secret in it)."""

    version: str
    digest: str
    policy: str
    mode: str
    windows: Mapping[str, int]
    ready: bool = True
    # The windows its upstreams told it (model to tokens), over the table's.
    learned: Mapping[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        return f"policy {self.policy}, mode {self.mode}, configuration {self.digest}, version {self.version}"


# What answers at an address: nothing, something that is not compaction-proxy, or one.
NOTHING = "nothing"


def _fetch(url: str, timeout: float) -> tuple[int, bytes] | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:  # noqa: S310 (http only)
            return answer.status, answer.read(65536)
    except urllib.error.HTTPError as error:
        return error.code, error.read(65536)
    except (urllib.error.URLError, OSError):
        return None


def identify(base: str, timeout: float = 2.0) -> Identity | str:
    """What answers at ``base``: its identity, ``NOTHING``, or a few words on what else it is."""
    answer = _fetch(f"{base}/readyz", timeout)
    if answer is None:
        return NOTHING
    status, body = answer
    try:
        said: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        said = None
    if not isinstance(said, dict) or said.get("service") != SERVICE or "config_digest" not in said:
        return f"something that is not compaction-proxy (it answered /readyz with {status})"
    windows = said.get("context_windows")
    learned = said.get("learned_windows")
    return Identity(
        version=str(said.get("version", "?")),
        digest=str(said["config_digest"]),
        policy=str(said.get("policy", "?")),
        mode=str(said.get("mode", "?")),
        windows=windows if isinstance(windows, dict) else {},
        ready=status == 200,
        learned={m: w for m, w in learned.items() if isinstance(w, int)} if isinstance(learned, dict) else {},
    )


def _get(url: str, timeout: float) -> str | None:
    answer = _fetch(url, timeout)
    return answer[1].decode(errors="replace") if answer and answer[0] == 200 else None


@dataclass
class Proxy:
    """The proxy a run goes through: one already answering, or one started for the run."""

    base: str
    identity: Identity
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    started_here: bool = field(default=False)
    # Said once on standard error before the agent starts (which proxy, and why).
    note: str | None = None

    def metrics(self) -> str:
        return _get(f"{self.base}/metrics", timeout=5.0) or ""

    def stop(self) -> None:
        """Stop the proxy this run started (by its PID; a shared one is left running)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def state_home(env: Mapping[str, str]) -> Path:
    """The per-user state directory of wrap: ``$XDG_STATE_HOME/compaction-proxy/wrap``, by
    default ``~/.local/state/compaction-proxy/wrap``. ``events`` finds runs there from any
    directory."""
    home = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(home) / "compaction-proxy" / "wrap"


def wrap_directory(env: Mapping[str, str]) -> Path:
    """Where a proxy started for a run works: its log, and its state (a relative ``state_dir``,
    the default ``./var`` included, resolves here, never in the agent's project). Kept across
    runs, so the events and saved outputs of a run can be read after it."""
    directory = state_home(env)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    return directory


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _config_name(config: str | None) -> str:
    return config or "the built-in configuration"


def chosen_proxy(settings: Settings, config: str | None, url: str | None, directory: Path) -> Proxy:
    """The proxy at ``--url`` (any configuration: the user named it; said when it is not
    ``config``'s), else the one at the configured address when it runs this configuration,
    else one started for the run. Raises ``WrapRefused`` rather than hand the agent's key to
    something unverified, or silently use another configuration's proxy."""
    wanted = settings_digest(settings)
    if url:
        base = url.rstrip("/").removesuffix("/v1")
        found = identify(base)
        if found == NOTHING:
            raise WrapRefused(f"no proxy answers at {url}")
        if not isinstance(found, Identity):
            raise WrapRefused(f"{found} answers at {url}: the agent's key is not sent there")
        note = f"using the proxy at {base} as asked (--url): {found.describe()}"
        if config and found.digest != wanted:
            note += f"; not the configuration of {config} ({wanted})"
        return Proxy(base, found, note=note)
    base = readiness_url(settings).removesuffix("/readyz")
    found = identify(base)
    if isinstance(found, Identity):
        if found.digest != wanted:
            raise WrapRefused(
                f"the compaction-proxy at {base} runs another configuration ({found.describe()}) "
                f"than {_config_name(config)} ({wanted}; its file and the COMPACTION_PROXY_* variables "
                f"of this shell both count): stop it, give {config or 'your configuration'} "
                f"another server.port, or pass --url {base} to use it as it is"
            )
        return Proxy(base, found, note=f"using the proxy already running at {base} ({found.describe()})")
    proxy = start_proxy(config, directory, wanted)
    if found != NOTHING:
        proxy.note = f"{found} answers at {base}: started a proxy for the run at {proxy.base} instead"
    return proxy


def start_proxy(config: str | None, directory: Path, digest: str) -> Proxy:
    """``serve`` on a free loopback port, working in ``directory``; ready once ``/readyz``
    answers as this configuration's compaction-proxy."""
    port = free_port()
    log_path = directory / f"proxy-{port}.log"
    command = [sys.executable, "-m", "proxy.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    if config:
        command += ["--config", str(Path(config).resolve())]
    with log_path.open("ab") as log:
        # Its own session: the terminal's signals are the agent's; wrap stops it by PID.
        process = subprocess.Popen(
            command, cwd=directory, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    base = f"http://127.0.0.1:{port}"
    proxy = Proxy(base, Identity("?", digest, "?", "?", {}), process, log_path, started_here=True)
    try:
        proxy.identity = _wait_ready(proxy, digest)
    except BaseException:
        proxy.stop()  # a signal or a refusal while it starts stops it too
        raise
    return proxy


def _wait_ready(proxy: Proxy, digest: str) -> Identity:
    assert proxy.process is not None and proxy.log_path is not None
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        if proxy.process.poll() is not None:
            tail = proxy.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the proxy did not start (exit {proxy.process.returncode}):\n{tail}")
        found = identify(proxy.base, timeout=1.0)
        if isinstance(found, Identity) and found.ready:
            if found.digest != digest:
                # Another process took the port between the probe and the bind.
                raise WrapRefused(f"the proxy at {proxy.base} is not the one started for the run")
            return found
        if found != NOTHING and not isinstance(found, Identity):
            raise WrapRefused(f"{found} answers at {proxy.base}, where the run's proxy should be")
        time.sleep(0.1)
    raise RuntimeError(f"the proxy was not ready within {READY_SECONDS:.0f} s (log: {proxy.log_path})")
