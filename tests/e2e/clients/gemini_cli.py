"""Gemini CLI (``@google/gemini-cli`` from npm) run offline against a base URL: ``gemini -p ...
--yolo`` in a scratch directory, with its own home and settings, a timeout, and its whole process
group killed after.

Observed with 0.61.0 against ``tests.gemini_upstream.GeminiUpstream``: with the settings of
``settings`` (``selectedType: gemini-api-key`` is required once ``GOOGLE_GEMINI_BASE_URL`` is
set: without it the CLI picks another auth type and refuses ``-p``), it sends its model router's
``:generateContent`` (a ``responseJsonSchema`` request on a flash-lite model) once per prompt,
then ``:streamGenerateContent?alt=sse`` turns with ``x-goog-api-key``; it keeps the server's
``thoughtSignature`` on its call, makes call ids up, runs each ``run_shell_command`` and sends
its output back as ``{"output": ...}``. Its own system prompt and 15 tools are about 10k tokens
in the fake's count. It is a JS bundle (about 100 MB): its keytar and node-pty install scripts
need not run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from tests.e2e.clients.claude_code import NPM_CACHE

GEMINI_CLI_VERSION = "0.61.0"  # the version the captured request bodies come from
# Its own prefix: an install never touches the one Claude Code and Codex share.
PREFIX = NPM_CACHE.parent / "npm-gemini"
API_KEY = "AIza-compaction-proxy-gemini-cli-0000"
TIMEOUT = 240.0
SETTINGS = {
    "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
    "ide": {"enabled": False},
}


def gemini_binary() -> Path | None:
    """Gemini CLI ``GEMINI_CLI_VERSION`` from npm, installed once into its own cache prefix.
    None without npm."""
    binary = PREFIX / "node_modules" / ".bin" / "gemini"
    if binary.exists():
        version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
        if GEMINI_CLI_VERSION in version.stdout:
            return binary
    npm = shutil.which("npm")
    if npm is None:
        return None
    PREFIX.mkdir(parents=True, exist_ok=True)
    package = f"@google/gemini-cli@{GEMINI_CLI_VERSION}"
    installed = subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--ignore-scripts", "--prefix", str(PREFIX), package],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if installed.returncode != 0 or not binary.exists():
        pytest.fail(f"npm install {package} failed:\n{installed.stderr[-2000:]}")
    return binary


@dataclass
class GeminiRun:
    returncode: int
    stdout: str
    stderr: str


def gemini_run(binary: Path, base_url: str, task: str, tmp: Path, key: str = API_KEY) -> GeminiRun:
    """``gemini -p task --yolo`` in a scratch directory under ``tmp`` with its own home, pointed at
    ``base_url``; its process group is killed when it ends or times out."""
    home, work = tmp / "gemini-home", tmp / "gemini-work"
    (home / ".gemini").mkdir(parents=True, exist_ok=True)
    work.mkdir(exist_ok=True)
    (home / ".gemini" / "settings.json").write_bytes(orjson.dumps(SETTINGS))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "GOOGLE_GEMINI_BASE_URL": base_url,
        "GEMINI_API_KEY": key,
        "TERM": "dumb",
        "NO_COLOR": "1",
    }
    process = subprocess.Popen(
        [str(binary), "-p", task, "--yolo"],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        return GeminiRun(-9, stdout, stderr + "\n[timed out]")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    return GeminiRun(process.returncode, stdout, stderr)
