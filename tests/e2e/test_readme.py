"""The README's commands run as written, in order, as a newcomer would type them.

Every ```bash and ```python block of the README carries a marker on the line before it:
``<!-- readme-test: run -->`` (run now, must exit 0), ``<!-- readme-test: serve -->`` (a
long-running ``serve``: started in the background, stopped at the next one or at the end) or
``<!-- readme-test: skip: <why> -->``. The blocks run in a scratch copy of what they use, with
a local fake upstream instead of api.openai.com. What differs from a newcomer's shell, and why:

- the install step (``python3 -m venv .venv && .venv/bin/pip install ...``) is taken off the
  front of a block and ``.venv`` is this test's own environment: CI runs the README's install
  and test command itself, and tests do not download packages;
- ports 8080 and 9000 become free loopback ports, and ``--host 0.0.0.0`` becomes 127.0.0.1
  (tests listen and connect on loopback only);
- the environment names the fake upstream (``COMPACTION_PROXY_UPSTREAM_URL``) and a test key.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest

from tests.fake_upstream import FakeUpstream, free_port

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
MARKED_BLOCK = re.compile(
    r"(?:<!-- readme-test: (?P<marker>[^>]*?) -->\n)?```(?P<language>bash|python)\n(?P<code>.*?)```",
    re.S,
)
INSTALL = re.compile(r"^python3 -m venv \.venv && \.venv/bin/pip install [^&]*&& ")


@dataclass
class Block:
    line: int
    marker: str
    language: str
    code: str


def readme_blocks() -> list[Block]:
    text = (ROOT / "README.md").read_text()
    return [
        Block(
            line=text[: m.start()].count("\n") + 1,
            marker=m.group("marker") or "",
            language=m.group("language"),
            code=m.group("code"),
        )
        for m in MARKED_BLOCK.finditer(text)
    ]


def test_every_shell_and_python_block_says_whether_it_runs() -> None:
    blocks = readme_blocks()
    assert len(blocks) >= 10
    for block in blocks:
        assert block.marker == "run" or block.marker == "serve" or block.marker.startswith("skip: "), (
            f"README.md line {block.line}: mark the block with <!-- readme-test: run|serve|skip: why -->"
        )


class Sandbox:
    def __init__(self, directory: Path, upstream: FakeUpstream) -> None:
        self.directory = directory
        self.ports = {"8080": str(free_port()), "9000": str(free_port())}
        self.server: subprocess.Popen[bytes] | None = None
        self.server_port = ""
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_PROXY_")},
            "OPENAI_API_KEY": "sk-readme-test",
            "COMPACTION_PROXY_UPSTREAM_URL": upstream.base_url,
            "COMPACTION_PROXY_ANTHROPIC_URL": upstream.base_url,
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        for name in ("examples", "config.yml", "config.starter.yml"):
            source = ROOT / name
            target = directory / name
            if source.is_dir():
                target.mkdir()
                for item in source.iterdir():
                    (target / item.name).write_bytes(item.read_bytes())
            else:
                target.write_bytes(source.read_bytes())
        (directory / ".venv").symlink_to(Path(sys.prefix))

    def adapt(self, code: str) -> str:
        code = INSTALL.sub("", code)
        for readme_port, port in self.ports.items():
            code = re.sub(rf"(127\.0\.0\.1|localhost):{readme_port}\b", rf"\g<1>:{port}", code)
            code = code.replace(f"--port {readme_port}", f"--port {port}")
        return code.replace("--host 0.0.0.0", "--host 127.0.0.1")

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
            f"README.md line {block.line} exited {done.returncode}:\n"
            f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        )
        return done.stdout

    def serve(self, block: Block) -> None:
        self.stop()
        code = self.adapt(block.code).strip()
        port = re.search(r"--port (\d+)", code)
        self.server_port = port.group(1) if port else self.ports["8080"]
        env = {**self.env, "COMPACTION_PROXY_PORT": self.ports["8080"]}
        log = (self.directory / f"serve_{block.line}.log").open("wb")
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
            assert self.server.poll() is None, (self.directory / f"serve_{block.line}.log").read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{self.server_port}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"README.md line {block.line}: the proxy did not become ready")

    def stop(self) -> None:
        if self.server is not None:
            os.killpg(self.server.pid, signal.SIGTERM)
            try:
                self.server.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.server.pid, signal.SIGKILL)
                self.server.wait(5)
            self.server = None


@pytest.fixture
def sandbox(tmp_path: Path, upstream: FakeUpstream) -> Iterator[Sandbox]:
    box = Sandbox(tmp_path, upstream)
    yield box
    box.stop()


def test_the_readme_runs_as_written(sandbox: Sandbox) -> None:
    outputs: dict[int, str] = {}
    ran = 0
    for block in readme_blocks():
        if block.marker == "serve":
            sandbox.serve(block)
        elif block.marker == "run":
            outputs[block.line] = sandbox.run(block)
            ran += 1
    assert ran >= 6
    printed = "\n".join(outputs.values())
    # The first compacted request: the headers say what the upstream received, and its event is
    # found by the session id the client sent.
    first = next(out for out in outputs.values() if "x-compaction" in out.lower())
    headers = dict(line.lower().split(": ", 1) for line in first.splitlines() if line.startswith("x-"))
    assert headers["x-compaction-policy"].strip() == "n_latest_10"
    assert int(headers["x-compaction-tokens-after"]) < int(headers["x-compaction-tokens-before"])
    assert '"policy":"n_latest_10"' in first
    assert "effective policies (default: improved" in printed
    assert "lean" in printed
    assert (sandbox.directory / "replay-demo" / "report.html").exists()
    # The start line of "Run it" says where it listens, where it forwards, what it applies.
    first_log = sorted(sandbox.directory.glob("serve_*.log"), key=lambda p: int(p.stem.split("_")[1]))[0]
    started = next(orjson.loads(line) for line in first_log.read_text().splitlines() if '"started"' in line)
    assert started["listen"] == f"http://127.0.0.1:{sandbox.ports['8080']}"
    assert started["upstream"] == sandbox.env["COMPACTION_PROXY_UPSTREAM_URL"]
    assert (started["policy"], started["mode"]) == ("full", "enforce")
    assert started["store"] == "sqlite var/compaction.db" and started["version"]
