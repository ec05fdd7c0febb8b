"""Claude Code (``@anthropic-ai/claude-code`` from npm) run offline against a base URL: ``claude -p``
in a scratch directory, with its own home, a timeout, and its whole process group killed after.

Observed with 2.1.197 against ``tests.anthropic_upstream.AnthropicUpstream`` (see
``tests/e2e/test_claude_code_direct.py``): with the environment of ``claude_env`` it probes
``HEAD /`` once, then sends only ``POST /v1/messages?beta=true`` (streamed; never
``count_tokens``), and connects nowhere but the base URL (checked with strace). Its own system
prompt and 24 tools are about 31k tokens in the fake's count; ``max_tokens`` is 32000 (thinking
``budget_tokens`` 31999) unless ``CLAUDE_CODE_MAX_OUTPUT_TOKENS`` lowers both. It retries 429
(honouring ``retry-after``), 529, mid-stream ``error`` events and resets (a reset is retried
*without streaming*), and an ``input length and `max_tokens` exceed context limit`` 400 with a
lower ``max_tokens``; it even retries a 401 (then prints ``Invalid API key · Fix external API
key``); ``CLAUDE_CODE_MAX_RETRIES`` bounds its retries. Over the window it compacts
by itself (its summary prompt as the last user message) unless ``DISABLE_COMPACT=1``, in which
case ``-p`` prints ``Prompt is too long`` and exits 1.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

CLAUDE_CODE_VERSION = "2.1.197"  # the version the captured request bodies come from
CLAUDE_MODEL = "claude-sonnet-4-5"
API_KEY = "sk-ant-api03-compaction-proxy-claude-code-0000"
TIMEOUT = 60.0
NPM_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "compaction-proxy" / "npm"
_PORT = re.compile(r"htons\((\d+)\)")
_ADDRESS = re.compile(r'inet_addr\("([^"]+)"\)|inet_pton\(AF_INET6, "([^"]+)"')


def claude_binary() -> Path | None:
    """Claude Code ``CLAUDE_CODE_VERSION`` from npm, installed once into the cache directory the
    Codex test uses (about 250 MB; its native binary comes in a platform package). None without
    npm."""
    binary = NPM_CACHE / "node_modules" / ".bin" / "claude"
    if binary.exists():
        version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
        if CLAUDE_CODE_VERSION in version.stdout:
            return binary
    npm = shutil.which("npm")
    if npm is None:
        return None
    NPM_CACHE.mkdir(parents=True, exist_ok=True)
    installed = subprocess.run(
        [
            npm,
            "install",
            "--no-audit",
            "--no-fund",
            "--prefix",
            str(NPM_CACHE),
            f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if installed.returncode != 0 or not binary.exists():
        pytest.fail(
            f"npm install @anthropic-ai/claude-code@{CLAUDE_CODE_VERSION} failed:\n{installed.stderr[-2000:]}"
        )
    return binary


@dataclass
class ClaudeRun:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    result: dict[str, Any] | None  # the ``--output-format json`` result object, when it printed one
    connects: list[str] = field(default_factory=list)  # non-loopback connect() attempts (traced runs)

    @property
    def final(self) -> str:
        """What ``claude -p`` answered (its final text, or its error line)."""
        return str(self.result.get("result", "")) if self.result else self.stdout.strip()

    @property
    def is_error(self) -> bool:
        return bool(self.result.get("is_error")) if self.result else self.returncode != 0


def claude_env(
    base_url: str,
    home: Path,
    *,
    api_key: str = API_KEY,
    max_output_tokens: int | None = None,
    own_compaction: bool = True,
    max_retries: int | None = 3,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """The environment of an offline run: the base URL and key, root allowed to skip permissions
    (``IS_SANDBOX``), no telemetry, error reports, update checks or other nonessential traffic,
    a private ``HOME`` (its settings and session files stay in the scratch directory). Its
    retries are bounded (``max_retries``, default 3; None: its own default of 10 with backoff, which
    keeps retrying even a 401 for minutes)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": api_key,
        "IS_SANDBOX": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "NO_COLOR": "1",
        "TERM": "dumb",
    }
    if max_output_tokens is not None:
        env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(max_output_tokens)
    if not own_compaction:
        env["DISABLE_COMPACT"] = "1"
    if max_retries is not None:
        env["CLAUDE_CODE_MAX_RETRIES"] = str(max_retries)
    return {**env, **(extra or {})}


def _outside_connects(trace: Path) -> list[str]:
    """connect() calls of the trace to an address that is not loopback."""
    found = []
    for line in (trace.read_text() if trace.exists() else "").splitlines():
        address, port = _ADDRESS.search(line), _PORT.search(line)
        if "connect(" not in line or address is None:
            continue
        host = address.group(1) or address.group(2)
        if not ipaddress.ip_address(host).is_loopback:
            found.append(f"{host}:{port.group(1) if port else '?'}")
    return found


def claude_run(
    binary: Path,
    base_url: str,
    task: str,
    tmp: Path,
    *,
    timeout: float = TIMEOUT,
    model: str = CLAUDE_MODEL,
    trace_network: bool = False,
    extra_args: list[str] | None = None,
    **env_options: Any,
) -> ClaudeRun:
    """``claude -p TASK --dangerously-skip-permissions --model MODEL --output-format json`` in
    ``tmp/claude-work`` (``env_options``: those of ``claude_env``). With ``trace_network`` (and
    strace installed) every connect() is traced and those not to loopback are returned."""
    home, work = tmp / "claude-home", tmp / "claude-work"
    home.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    command = [
        str(binary),
        "-p",
        task,
        "--dangerously-skip-permissions",
        "--model",
        model,
        "--output-format",
        "json",
        *(extra_args or []),  # e.g. --continue: the same session again, in the same home
    ]
    trace = tmp / "claude-connects.txt"
    strace = shutil.which("strace") if trace_network else None
    if strace:
        command = [strace, "-f", "-qq", "-e", "trace=connect", "-o", str(trace), *command]
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        cwd=work,
        env=claude_env(base_url, home, **env_options),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, so that the shells it starts die with it
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate(timeout=10)
        pytest.fail(
            f"claude -p did not finish in {timeout:.0f} s\nstdout: {stdout[-2000:]}\nstderr: {stderr[-2000:]}"
        )
    finally:
        with contextlib.suppress(ProcessLookupError):  # what it left running in its group goes too
            os.killpg(process.pid, signal.SIGKILL)
    result = None
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if lines:
        try:
            result = orjson.loads(lines[-1])
        except orjson.JSONDecodeError:
            result = None
    return ClaudeRun(
        returncode=process.returncode,
        stdout=stdout,
        stderr=stderr,
        seconds=time.monotonic() - started,
        result=result,
        connects=_outside_connects(trace) if strace else [],
    )
