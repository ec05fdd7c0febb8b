"""``compaction-proxy demo``: see compaction happen in a few seconds, with no key and no config.

It starts the stand-in model (``stand_in_model.py``: a local Chat Completions server with a
small window) in a thread, starts a real proxy (``serve``, as a subprocess on a free loopback
port, the built-in default policy and mode) with a temporary configuration that points it at
the stand-in and gives the stand-in's model its window, plays the scripted coding-agent session
(``demo_session.py``) through it, and prints what compaction did (``demo_report.py``). The
configuration, the store and the proxy's log live in a temporary directory, removed at the end
unless ``--keep``, which also keeps the proxy and the stand-in running (for ``/ui``) until
Ctrl-C. Everything it starts it stops, by PID, on Ctrl-C and SIGTERM too.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import orjson

from proxy.commands.demo_report import SESSION, Outcome, RequestRow, render_json, render_text
from proxy.commands.demo_session import SCRIPT, SYSTEM_PROMPT, TASK, TOOLS
from proxy.commands.stand_in_model import MODEL, StandInModel, StandInServer

WINDOW = 16_384
MAX_TOKENS = 1024
READY_SECONDS = 30.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def demo_config(directory: Path, upstream: str, port: int, window: int) -> dict[str, Any]:
    """The proxy's temporary configuration: where the stand-in is, and its model's window (a name
    the built-in models table does not know would get the 128,000-token default). Policy and
    mode are left to the built-in defaults: what a first ``serve`` does."""
    return {
        "server": {"host": "127.0.0.1", "port": port},
        "upstream": {"base_url": upstream},
        # No request of the demo goes to Anthropic's door; should one come (with --keep), it
        # reaches the stand-in, never the network.
        "anthropic": {"base_url": upstream.removesuffix("/v1")},
        "state_dir": str(directory / "state"),
        "logging": {"level": "warning"},
        "models": {MODEL: {"window": window}},
        # Requests left alone are recorded too, so the session page charts every request.
        "events": {"record_skipped": True},
    }


def proxy_environment(env: dict[str, str]) -> dict[str, str]:
    """The caller's environment without the proxy's own variables: the demo's configuration is
    the whole story (no upstream URL, key or config file of the user's applies)."""
    return {
        k: v
        for k, v in env.items()
        if not k.startswith("COMPACTION_PROXY_") and k != "PROMETHEUS_MULTIPROC_DIR"
    }


@dataclass
class ProxyProcess:
    """``compaction-proxy serve`` started for the demo; stopped by its PID."""

    process: subprocess.Popen[bytes]
    base: str
    log_path: Path

    @classmethod
    def launch(cls, config: Path, port: int, directory: Path) -> ProxyProcess:
        log_path = directory / "proxy.log"
        command = [sys.executable, "-m", "proxy.cli", "serve", "--config", str(config)]
        with log_path.open("wb") as log:
            # Its own session: a Ctrl-C in the terminal reaches the demo, which stops it in order.
            process = subprocess.Popen(
                command,
                cwd=directory,
                env=proxy_environment(dict(os.environ)),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return cls(process, f"http://127.0.0.1:{port}", log_path)

    def wait_ready(self) -> None:
        """Until ``/readyz`` answers (the caller stops the process if this raises)."""
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the proxy did not start (exit {self.process.returncode}):\n{tail}")
            try:
                if httpx.get(f"{self.base}/readyz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"the proxy was not ready within {READY_SECONDS:.0f} s")

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM ends the demo the way Ctrl-C does: through the ``finally`` that stops what it started."""

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass
class AgentRun:
    """The scripted agent's side: its messages, and what each request's answer said."""

    messages: list[dict[str, Any]] = field(
        default_factory=lambda: [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": TASK},
        ]
    )
    rows: list[RequestRow] = field(default_factory=list)
    steps_run: int = 0

    def body(self) -> dict[str, Any]:
        return {"model": MODEL, "messages": self.messages, "tools": TOOLS, "max_tokens": MAX_TOKENS}

    def run(self, call: dict[str, Any]) -> str:
        """What the call prints. The repository changes as the session goes (the same test
        command fails at first and passes at the end), so the output is the script's next
        step's, checked against the call as a real tool would take it."""
        function = call.get("function") or {}
        if self.steps_run >= len(SCRIPT):
            return "error: the scripted session has no more steps"
        step = SCRIPT[self.steps_run]
        self.steps_run += 1
        if (function.get("name"), function.get("arguments")) != (step.tool, step.arguments_json()):
            return f"error: unexpected call {function.get('name')}({function.get('arguments')})"
        return step.output

    def play(self, client: httpx.Client, limit: int) -> None:
        """The agent loop: send the history, run each tool call the answer makes, until the model
        answers without one."""
        for _ in range(limit):
            answer = client.post("/chat/completions", json=self.body(), headers={"x-session-id": SESSION})
            headers = {
                k.lower(): v for k, v in answer.headers.items() if k.lower().startswith("x-compaction-")
            }
            self.rows.append(RequestRow(len(self.rows) + 1, answer.status_code, headers))
            if answer.status_code != 200:
                raise RuntimeError(
                    f"request {len(self.rows)} got HTTP {answer.status_code}: {answer.text[:500]}"
                )
            message = answer.json()["choices"][0]["message"]
            self.messages.append({k: v for k, v in message.items() if k in ("role", "content", "tool_calls")})
            calls = message.get("tool_calls") or []
            for call in calls:
                self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": self.run(call)})
            if not calls:
                return
        raise RuntimeError(f"the session did not finish within {limit} requests")


def run_demo(*, keep: bool, as_json: bool, window: int = WINDOW) -> int:
    started = time.monotonic()
    directory = Path(tempfile.mkdtemp(prefix="compaction-proxy-demo-"))
    model = StandInModel(window)
    stand_in = StandInServer(model).start()
    # The encoding loads (about 0.3 s) while the proxy starts, not on the first request.
    warm = threading.Thread(target=model.counter.warm_up, daemon=True)
    warm.start()
    proxy: ProxyProcess | None = None
    with terminate_as_interrupt():
        try:
            port = free_port()
            config = directory / "demo.yml"
            config.write_bytes(orjson.dumps(demo_config(directory, stand_in.base_url, port, window)))
            # Assigned before it is waited for: an interrupt while it starts still stops it.
            proxy = ProxyProcess.launch(config, port, directory)
            proxy.wait_ready()
            ready = time.monotonic() - started
            warm.join()
            outcome = play(proxy, stand_in, model, config, keep=keep)
            outcome.seconds.update(proxy_ready=ready, total=time.monotonic() - started)
            sys.stdout.write(render_json(outcome) if as_json else render_text(outcome, color=_color()))
            sys.stdout.flush()
            if keep:
                _wait_for_interrupt()
            return 0
        except KeyboardInterrupt:
            sys.stderr.write("\ncompaction-proxy demo: interrupted; stopping what it started\n")
            return 130
        except (RuntimeError, httpx.HTTPError) as exc:
            log = proxy.log_path if proxy else directory / "proxy.log"
            sys.stderr.write(f"compaction-proxy demo: {exc}\n  (the proxy's log: {log})\n")
            keep = True  # the log is what explains it
            return 1
        finally:
            # Neither a second Ctrl-C nor a SIGTERM may cut the clean-up short and leave the proxy.
            previous = (
                signal.signal(signal.SIGINT, signal.SIG_IGN),
                signal.signal(signal.SIGTERM, signal.SIG_IGN),
            )
            try:
                if proxy is not None:
                    proxy.stop()
                stand_in.stop()
                if not keep:
                    shutil.rmtree(directory, ignore_errors=True)
            finally:
                signal.signal(signal.SIGINT, previous[0])
                signal.signal(signal.SIGTERM, previous[1])


def play(
    proxy: ProxyProcess, stand_in: StandInServer, model: StandInModel, config: Path, *, keep: bool
) -> Outcome:
    """The scripted session through the proxy, its events read back, and its last request sent
    straight to the stand-in (to show the error the proxy kept the agent from)."""
    started = time.monotonic()
    agent = AgentRun()
    with httpx.Client(base_url=f"{proxy.base}/v1", timeout=60.0) as client:
        agent.play(client, limit=len(SCRIPT) + 5)
        session_seconds = time.monotonic() - started
        events = client.get("/compaction/events", params={"session": SESSION, "limit": 1000}).json()
    overflow = httpx.post(f"{stand_in.base_url}/chat/completions", json=agent.body(), timeout=30.0)
    return Outcome(
        model=MODEL,
        window=model.window,
        stand_in=stand_in.base_url,
        proxy=proxy.base,
        proxy_pid=proxy.process.pid,
        config=config,
        state_dir=config.parent,
        keep=keep,
        rows=agent.rows,
        events=events.get("data", []),
        reads=model.reads,
        last_messages=model.last_messages,
        agent_messages=agent.messages,
        overflow_status=overflow.status_code,
        overflow=overflow.json(),
        seconds={"session": session_seconds},
    )


def _wait_for_interrupt() -> None:
    """``--keep``: the proxy and the stand-in stay up (for ``/ui``) until Ctrl-C or SIGTERM."""
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        sys.stderr.write("\ncompaction-proxy demo: stopped the proxy and the stand-in model\n")


def _color() -> bool:
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"
