"""Codex CLI (``codex exec``, from npm) on the Responses API: a custom provider at the proxy, its
own ``CODEX_HOME``, nothing that reaches the network; it really runs its shell commands."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from tests.e2e.clients.responses import API_KEY
from tests.responses_upstream import STEP_MARK

# Codex CLI: its steps run real shell commands (GNU seq and sed) printing about 2k tokens each.
CODEX_VERSION = "0.171.0"
# Codex runs as the model of the captured bodies (tests/fixtures/clients): its own tool set for it
# (exec_command, apply_patch as a custom tool, tool_search, web_search...).
CODEX_MODEL = "gpt-5.5"
CODEX_TIMEOUT = 90.0
STEP_LINE = re.compile(rf"{STEP_MARK}-(\d+) line 1:")
NPM_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "compaction-proxy" / "npm"


def codex_binary() -> Path | None:
    """Codex CLI ``CODEX_VERSION`` (the version the captured bodies in tests/fixtures/clients come
    from) from npm, installed once into a cache directory (about 420 MB; None without npm)."""
    binary = NPM_CACHE / "node_modules" / ".bin" / "codex"
    if binary.exists():
        version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
        if CODEX_VERSION in version.stdout:
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
            f"@openai/codex@{CODEX_VERSION}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if installed.returncode != 0 or not binary.exists():
        pytest.fail(f"npm install @openai/codex@{CODEX_VERSION} failed:\n{installed.stderr[-2000:]}")
    return binary


@dataclass
class CodexRun:
    returncode: int
    stdout: str
    stderr: str
    last_message: str
    rollout: str  # Codex's own session record (its history), JSONL
    seconds: float


def codex_config(
    base_url: str,
    *,
    context_window: int,
    auto_compact: int | None,
    retries: bool,
    remote_compaction: bool = False,
) -> str:
    """Codex's ``config.toml``: a custom Responses provider at ``base_url``; nothing that reaches
    the network (no update check, analytics, plugin sync or apps: without these four settings
    Codex looks up github.com and chatgpt.com at start); Codex's own compaction at
    ``auto_compact`` tokens (None: never, for practical purposes); its retries off unless
    ``retries`` (then its defaults). ``remote_compaction``: the provider declares remote
    compaction v2 (``capabilities.remote_compaction = "v2"``): Codex compacts by asking it (a
    ``compaction_trigger`` item) instead of with its own summary prompt."""
    compact = auto_compact if auto_compact is not None else 10 * context_window
    retry = "" if retries else "request_max_retries = 0\nstream_max_retries = 0\n"
    if remote_compaction:
        retry += '\n[model_providers.proxy.capabilities]\nremote_compaction = "v2"\n'

    return f"""model_provider = "proxy"
model_context_window = {context_window}
model_auto_compact_token_limit = {compact}
check_for_update_on_startup = false

[analytics]
enabled = false

[features]
plugins = false
apps = false

[model_providers.proxy]
name = "compaction-proxy"
base_url = "{base_url}"
wire_api = "responses"
env_key = "CPX_CODEX_KEY"
stream_idle_timeout_ms = 30000
{retry}"""


def codex_run(
    binary: Path,
    base_url: str,
    task: str,
    tmp: Path,
    *,
    context_window: int = 1_000_000,
    auto_compact: int | None = None,
    retries: bool = False,
    timeout: float = CODEX_TIMEOUT,
    remote_compaction: bool = False,
) -> CodexRun:
    """``codex exec`` against ``base_url``, in a scratch directory, with its own ``CODEX_HOME``
    (``--strict-config``: a setting this version does not know is an error)."""
    home = tmp / "codex-home"
    work = tmp / "codex-work"
    home.mkdir()
    work.mkdir()
    (home / "config.toml").write_text(
        codex_config(
            base_url,
            context_window=context_window,
            auto_compact=auto_compact,
            retries=retries,
            remote_compaction=remote_compaction,
        )
    )
    last = tmp / "codex-last-message.txt"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "CODEX_HOME": str(home),
        "CPX_CODEX_KEY": API_KEY,
        "RUST_LOG": "warn",
        "NO_COLOR": "1",
        "TERM": "dumb",
    }
    command = [
        str(binary),
        "exec",
        "--strict-config",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "--color",
        "never",
        "-o",
        str(last),
        "-m",
        CODEX_MODEL,
        task,
    ]
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate(timeout=10)
        pytest.fail(f"codex exec did not finish in {timeout:.0f} s\nstderr: {stderr[-3000:]}")
    rollout = "\n".join(p.read_text() for p in sorted((home / "sessions").rglob("*.jsonl")))
    return CodexRun(
        returncode=process.returncode,
        stdout=stdout,
        stderr=stderr,
        last_message=last.read_text() if last.exists() else "",
        rollout=rollout,
        seconds=time.monotonic() - started,
    )


def codex_errors(run: CodexRun) -> list[str]:
    return [line for line in run.stderr.splitlines() if line.startswith("ERROR")]


def codex_steps(rollout: str) -> list[int]:
    """The scripted steps whose output Codex recorded as its own tool results."""
    steps: list[int] = []
    for line in rollout.splitlines():
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        payload = record.get("payload") if isinstance(record, dict) else None
        if isinstance(payload, dict) and payload.get("type") == "function_call_output":
            output = orjson.dumps(payload.get("output")).decode()
            found = [int(s) for s in STEP_LINE.findall(output)]
            steps += sorted(set(found))
    return steps
