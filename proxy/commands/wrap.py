"""``compaction-proxy wrap AGENT [-- ARGS]``: run a coding agent through the proxy in one command.

It uses the proxy already answering at ``--url`` (or at the configured address), else starts
one (``serve`` with the given configuration, on a free port, its log in a file), points the
agent at it the way that agent reads a base URL, names the run's session, runs the agent in the
foreground (the terminal is the agent's), and when the agent exits prints what the proxy did
during the run and stops the proxy it started, by its PID. The agent's exit status is wrap's.

The figures are the difference of the proxy's own metrics before and after the run: exact
with a proxy started for the run, and including any other client's traffic with a shared one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from prometheus_client.parser import text_string_to_metric_families

from proxy.commands.preflight import readiness_url
from proxy.config.settings import Settings

SESSION_HEADER = "x-session-id"
READY_SECONDS = 30.0


def agent_environment(agent: str, base: str, session: str, env: Mapping[str, str]) -> dict[str, str]:
    """The agent's environment with the proxy as its API: ``base`` is the proxy's root URL
    (``http://host:port``). Keys stay as the user set them: the proxy passes each to the
    provider its client addressed."""
    out = dict(env)
    name = Path(agent).name
    out["COMPACTION_PROXY_SESSION"] = session
    if name == "claude":
        # Claude Code reads the Anthropic base URL without /v1, and sends these headers on every request.
        out["ANTHROPIC_BASE_URL"] = base
        extra = [h for h in env.get("ANTHROPIC_CUSTOM_HEADERS", "").splitlines() if h.strip()]
        out["ANTHROPIC_CUSTOM_HEADERS"] = "\n".join([*extra, f"{SESSION_HEADER}: {session}"])
    elif name != "codex":
        # Any other agent: the variables OpenAI's and Anthropic's SDKs, LiteLLM and aider read.
        out["OPENAI_BASE_URL"] = f"{base}/v1"
        out["OPENAI_API_BASE"] = f"{base}/v1"
        out["ANTHROPIC_BASE_URL"] = base
    return out


def agent_command(agent: str, args: Sequence[str], base: str, session: str) -> list[str]:
    """The agent's command line. Codex reads its provider from its configuration: a provider of
    its own for the run is given on the command line (``-c``), the user's files untouched."""
    if Path(agent).name != "codex":
        return [agent, *args]
    provider = (
        f'{{name="compaction-proxy", base_url="{base}/v1", wire_api="responses", '
        f'env_key="OPENAI_API_KEY", http_headers={{"{SESSION_HEADER}"="{session}"}}}}'
    )
    return [
        agent,
        "-c",
        'model_provider="compaction-proxy"',
        "-c",
        f"model_providers.compaction-proxy={provider}",
        *args,
    ]


@dataclass(frozen=True)
class Figures:
    """What the proxy's metrics said at one moment (totals over every series)."""

    requests: float = 0.0
    tokens_before: float = 0.0
    tokens_after: float = 0.0
    compaction_points: float = 0.0
    reads: float = 0.0
    errors: float = 0.0

    def minus(self, earlier: Figures) -> Figures:
        return Figures(*(a - b for a, b in zip(_values(self), _values(earlier), strict=True)))


def _values(figures: Figures) -> tuple[float, ...]:
    return (
        figures.requests,
        figures.tokens_before,
        figures.tokens_after,
        figures.compaction_points,
        figures.reads,
        figures.errors,
    )


_SAMPLES = {
    "compaction_proxy_requests_total": "requests",
    "compaction_proxy_context_tokens_before_sum": "tokens_before",
    "compaction_proxy_context_tokens_after_sum": "tokens_after",
    "compaction_proxy_compaction_points_total": "compaction_points",
    "compaction_proxy_read_tool_output_calls_total": "reads",
    "compaction_proxy_errors_total": "errors",
}


def parse_figures(exposition: str) -> Figures:
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            name = _SAMPLES.get(sample.name)
            if name is not None:
                found[name] = found.get(name, 0.0) + sample.value
    return Figures(**found)


def summary_lines(figures: Figures, *, session: str, log_path: Path | None, shared: bool) -> list[str]:
    saved = figures.tokens_before - figures.tokens_after
    share = f" ({saved / figures.tokens_before:.0%})" if figures.tokens_before else ""
    lines = [
        f"compaction-proxy: {figures.requests:.0f} requests in session {session}",
        f"  prompt tokens: {figures.tokens_before:,.0f} sent by the agent, "
        f"{figures.tokens_after:,.0f} upstream",
        f"  saved: {saved:,.0f} prompt tokens{share}",
        f"  compaction points: {figures.compaction_points:.0f}, saved outputs read back: {figures.reads:.0f}",
    ]
    if figures.compaction_points == 0:
        lines.append("  nothing was compacted: the run stayed under the policy's trigger")
    if figures.errors:
        lines.append(f"  errors: {figures.errors:.0f} (see the proxy's log)")
    if shared:
        lines.append("  (a proxy that was already running: its other clients' traffic is counted too)")
    if log_path is not None:
        lines.append(f"  proxy log: {log_path}")
    return lines


def summary_json(figures: Figures, *, session: str, proxy: Proxy) -> bytes:
    return orjson.dumps(
        {
            "session": session,
            "proxy_url": proxy.base,
            "requests": round(figures.requests),
            "tokens_before": round(figures.tokens_before),
            "tokens_after": round(figures.tokens_after),
            "tokens_saved": round(figures.tokens_before - figures.tokens_after),
            "compaction_points": round(figures.compaction_points),
            "reads": round(figures.reads),
            "errors": round(figures.errors),
            "shared_proxy": not proxy.started_here,
            "proxy_log": str(proxy.log_path) if proxy.log_path else None,
        }
    )


def _get(url: str, timeout: float = 2.0) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:  # noqa: S310 (http only)
            body: bytes = answer.read()
            return body.decode() if answer.status == 200 else None
    except (urllib.error.URLError, OSError):
        return None


@dataclass
class Proxy:
    """The proxy a run goes through: one already answering, or one started for the run."""

    base: str
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    started_here: bool = field(default=False)

    def figures(self) -> Figures:
        return parse_figures(_get(f"{self.base}/metrics", timeout=5.0) or "")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def running_at(url: str) -> Proxy | None:
    base = url.rstrip("/").removesuffix("/v1")
    return Proxy(base) if _get(f"{base}/readyz") is not None else None


def wrap_directory(env: Mapping[str, str]) -> Path:
    """Where a proxy started for a run works: its log, and its state (a relative ``state_dir``,
    the default ``./var`` included, resolves here, never in the agent's project). Kept across
    runs, so the events and saved outputs of a run can be read after it."""
    state_home = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    directory = Path(state_home) / "compaction-proxy" / "wrap"
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    return directory


def start_proxy(config: str | None, directory: Path) -> Proxy:
    """``serve`` on a free loopback port, working in ``directory``; ready once ``/readyz`` answers."""
    port = free_port()
    log_path = directory / f"proxy-{port}.log"
    command = [sys.executable, "-m", "proxy.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    if config:
        command += ["--config", str(Path(config).resolve())]
    with log_path.open("ab") as log:
        # Its own session: the terminal's Ctrl-C is the agent's, the proxy is stopped by PID after.
        process = subprocess.Popen(
            command, cwd=directory, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    proxy = Proxy(f"http://127.0.0.1:{port}", process, log_path, started_here=True)
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the proxy did not start (exit {process.returncode}):\n{tail}")
        if _get(f"{proxy.base}/readyz", timeout=1.0) is not None:
            return proxy
        time.sleep(0.1)
    proxy.stop()
    raise RuntimeError(f"the proxy was not ready within {READY_SECONDS:.0f} s (log: {log_path})")


@contextlib.contextmanager
def interrupts_go_to_the_agent() -> Iterator[None]:
    """While the agent runs, Ctrl-C is the agent's alone (it shares the terminal's process group)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run_wrapped(
    agent: str,
    args: Sequence[str],
    *,
    settings: Settings,
    config: str | None,
    url: str | None,
    as_json: bool,
) -> int:
    """Run ``agent`` through a proxy; print what it did; the agent's exit status."""
    proxy = running_at(url) if url else None
    if url and proxy is None:
        sys.stderr.write(f"compaction-proxy: no proxy answers at {url}\n")
        return 1
    if proxy is None:
        proxy = running_at(readiness_url(settings).removesuffix("/readyz"))
    if proxy is None:
        proxy = start_proxy(config, wrap_directory(os.environ))
    session = f"wrap-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    try:
        before = proxy.figures()
        command = agent_command(agent, args, proxy.base, session)
        environment = agent_environment(agent, proxy.base, session, os.environ)
        with interrupts_go_to_the_agent():
            try:
                code = subprocess.call(command, env=environment)
            except FileNotFoundError:
                sys.stderr.write(f"compaction-proxy: {agent}: command not found\n")
                return 127
        ran = proxy.figures().minus(before)
        shared = not proxy.started_here
        if as_json:
            sys.stderr.write(summary_json(ran, session=session, proxy=proxy).decode())
            sys.stderr.write("\n")
        else:
            lines = summary_lines(ran, session=session, log_path=proxy.log_path, shared=shared)
            sys.stderr.write("\n".join(lines) + "\n")
        return code
    finally:
        proxy.stop()
