"""The documentation's command blocks, and the scratch directory one page's blocks run in.

Used by ``test_readme.py``. A page is ``README.md`` or any ``docs/**/*.md``; its ```bash and
```python blocks run in order, each marked on the line before it (``<!-- readme-test: run -->``,
``serve`` or ``skip: <why>``).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.fake_upstream import FakeUpstream, free_port

ROOT = Path(__file__).resolve().parents[2]
MARKED_BLOCK = re.compile(
    r"(?:<!-- readme-test: (?P<marker>[^>]*?) -->\n)?```(?P<language>bash|python)\n(?P<code>.*?)```",
    re.S,
)
# Fences that would hold commands but escape the marker rule: pages write ```bash or ```python.
UNCHECKED_FENCE = re.compile(r"^\s*```(?:sh|shell|zsh|py|python3)\s*$", re.M)
INSTALL = re.compile(r"^python3 -m venv \.venv && \.venv/bin/pip install [^&]*&& ")
# What the pages' blocks read from the repository, copied into each page's scratch directory.
COPIED = (
    "examples",
    "config.yml",
    "config.starter.yml",
    "replay.example.yml",
    "tests/fixtures/trajectories_sample.jsonl",
)


@dataclass
class Block:
    line: int
    marker: str
    language: str
    code: str


def pages() -> list[str]:
    """The README and every page of the documentation site, as paths from the repository root."""
    docs = sorted(path.relative_to(ROOT).as_posix() for path in (ROOT / "docs").rglob("*.md"))
    return ["README.md", *docs]


def page_text(page: str) -> str:
    return (ROOT / page).read_text()


def page_blocks(page: str) -> list[Block]:
    text = page_text(page)
    return [
        Block(
            line=text[: m.start()].count("\n") + 1,
            marker=m.group("marker") or "",
            language=m.group("language"),
            code=m.group("code"),
        )
        for m in MARKED_BLOCK.finditer(text)
    ]


class Sandbox:
    """A scratch copy of what the blocks use, a fake upstream instead of the real API, and at most
    one proxy started by a ``serve`` block (stopped by its process group at the next one or at
    the end)."""

    def __init__(self, directory: Path, upstream: FakeUpstream) -> None:
        self.directory = directory
        self.page = ""
        self.ports = {"8080": str(free_port()), "9000": str(free_port())}
        self.server: subprocess.Popen[bytes] | None = None
        self.server_port = ""
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_PROXY_")},
            "OPENAI_API_KEY": "sk-readme-test",
            "COMPACTION_PROXY_UPSTREAM_URL": upstream.base_url,
            "COMPACTION_PROXY_ANTHROPIC_URL": upstream.base_url,
            "PYTHONDONTWRITEBYTECODE": "1",
            # `wrap` keeps its proxy's state and log under $XDG_STATE_HOME: here, not in $HOME.
            "XDG_STATE_HOME": str(directory / ".state"),
        }
        for name in COPIED:
            source, target = ROOT / name, directory / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, target)
            else:
                shutil.copyfile(source, target)
        (directory / ".venv").symlink_to(Path(sys.prefix))

    def where(self, block: Block) -> str:
        return f"{self.page} line {block.line}"

    def adapt(self, code: str) -> str:
        code = INSTALL.sub("", code)
        for doc_port, port in self.ports.items():
            code = re.sub(rf"(127\.0\.0\.1|localhost):{doc_port}\b", rf"\g<1>:{port}", code)
            code = code.replace(f"--port {doc_port}", f"--port {port}")
        return code.replace("--host 0.0.0.0", "--host 127.0.0.1")

    def run_page(self, page: str) -> dict[int, str]:
        """Runs the page's blocks in order; the standard output of each ``run`` block by line."""
        self.page = page
        outputs: dict[int, str] = {}
        for block in page_blocks(page):
            if block.marker == "serve":
                self.serve(block)
            elif block.marker == "run":
                outputs[block.line] = self.run(block)
        return outputs

    def run(self, block: Block) -> str:
        code = self.adapt(block.code)
        if block.language == "python":
            script = self.directory / f"block_{block.line}.py"
            script.write_text(code)
            command = [str(self.directory / ".venv" / "bin" / "python"), str(script)]
        else:
            command = ["bash", "-c", "set -eu\n" + code]
        done = subprocess.run(
            command, cwd=self.directory, env=self.env, capture_output=True, text=True, timeout=180
        )
        assert done.returncode == 0, (
            f"{self.where(block)} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        )
        return done.stdout

    def serve(self, block: Block) -> None:
        self.stop()
        code = self.adapt(block.code).strip()
        port = re.search(r"--port (\d+)", code)
        self.server_port = port.group(1) if port else self.ports["8080"]
        env = {**self.env, "COMPACTION_PROXY_PORT": self.ports["8080"]}
        log_path = self.directory / f"serve_{block.line}.log"
        with log_path.open("wb") as log:
            self.server = subprocess.Popen(
                ["bash", "-c", "exec " + code],
                cwd=self.directory,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.server.poll() is None, f"{self.where(block)}:\n{log_path.read_text()}"
            try:
                if httpx.get(f"http://127.0.0.1:{self.server_port}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"{self.where(block)}: the proxy did not become ready")

    def stop(self) -> None:
        if self.server is not None:
            os.killpg(self.server.pid, signal.SIGTERM)
            try:
                self.server.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.server.pid, signal.SIGKILL)
                self.server.wait(5)
            self.server = None
