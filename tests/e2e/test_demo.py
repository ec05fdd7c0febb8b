"""``compaction-proxy demo`` as a newcomer runs it: no key, no config, one command. It shows at
least one compaction (the headers and an event row), the read of saved outputs and the /ui link,
exits 0, and leaves no process and no temporary directory behind, on Ctrl-C too. Its run time
is printed (pytest -s) rather than asserted: it is measured and reported, not a flaky gate."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def environment(tmp_path: Path) -> dict[str, str]:
    """The user's environment, with variables the demo must ignore (it reads only its own file)."""
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "PYTHONPATH": str(ROOT),
        "TMPDIR": str(tmp_path),  # where its temporary directory goes
        "COMPACTION_PROXY_UPSTREAM_URL": "http://127.0.0.1:9/v1",
        "COMPACTION_PROXY_CONFIG": str(tmp_path / "missing.yml"),
    }


def default_interrupts() -> None:
    # The test runner may start children with SIGINT ignored; a terminal's Ctrl-C is not.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def launch(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "proxy.cli", "demo", *args],
        cwd=tmp_path,
        env=environment(tmp_path),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_interrupts,
    )


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def demo_directories(tmp_path: Path) -> list[Path]:
    return sorted(tmp_path.glob("compaction-proxy-demo-*"))


def test_the_demo_shows_compaction_and_leaves_nothing_behind(tmp_path: Path) -> None:
    started = time.monotonic()
    demo = launch(tmp_path)
    out, err = demo.communicate(timeout=120)
    seconds = time.monotonic() - started
    assert demo.returncode == 0, err + out
    print(f"\ndemo: {seconds:.1f} s wall clock\n{out}")
    # The headers of a compaction point, as the proxy sent them.
    assert "x-compaction-trigger: threshold" in out
    before = int(re.search(r"x-compaction-tokens-before: (\d+)", out).group(1))  # type: ignore[union-attr]
    after = int(re.search(r"x-compaction-tokens-after: (\d+)", out).group(1))  # type: ignore[union-attr]
    assert after < before
    # An event row: time, trigger, request, tokens before -> after, handles saved.
    assert re.search(r"^  \d\d:\d\d:\d\d\.\d{3}  threshold +\d+ +[\d,]+ -> [\d,]+ +[1-9]", out, re.M), out
    assert 'read_tool_output({"handle":"*","pattern":"^FAILED"})' in out
    assert "| FAILED tests/test_totals.py::test_many_lines" in out
    assert "## State ledger" in out
    assert "HTTP 400 context_length_exceeded" in out
    assert re.search(r"Session page: http://127\.0\.0\.1:\d+/ui#session=s_\w+:improved", out)
    assert "demo --keep" in out
    # Everything it started is stopped, and its temporary directory removed.
    pid = int(re.search(r"pid (\d+)", out).group(1))  # type: ignore[union-attr]
    proxy = re.search(r"serve at (http://127\.0\.0\.1:\d+)", out).group(1)  # type: ignore[union-attr]
    assert not alive(pid)
    assert not answers(f"{proxy}/readyz")
    assert demo_directories(tmp_path) == []


def test_json_says_the_same(tmp_path: Path) -> None:
    demo = launch(tmp_path, "--json")
    out, err = demo.communicate(timeout=120)
    assert demo.returncode == 0, err
    found: dict[str, Any] = json.loads(out)
    assert found["model"] == "stand-in-coder" and found["window"] == 16_384
    assert found["largest_request_tokens"] > found["window"]
    assert any(row["headers"].get("x-compaction-trigger") == "threshold" for row in found["compacted"])
    triggers = [event["trigger"] for event in found["events"]]
    assert triggers[0] == "threshold" and "repeated" in triggers
    assert sum(event["reads"] for event in found["events"]) == 1
    assert "FAILED tests/test_totals.py::test_many_lines" in found["reads"][0]["result"]
    assert found["without_proxy"]["status"] == 400
    assert found["without_proxy"]["error"]["code"] == "context_length_exceeded"
    assert found["state_dir"] is None and demo_directories(tmp_path) == []
    assert not alive(found["proxy_pid"])


def read_until(stream: IO[str], marker: str) -> str:
    lines = []
    for line in stream:
        lines.append(line)
        if line.startswith(marker):
            break
    return "".join(lines)


def test_keep_serves_the_page_until_ctrl_c(tmp_path: Path) -> None:
    demo = launch(tmp_path, "--keep")
    try:
        assert demo.stdout is not None
        out = read_until(demo.stdout, "Timings:")
        page = re.search(r"Session page: (\S+)", out).group(1)  # type: ignore[union-attr]
        assert answers(page.split("#")[0])
        pid = int(re.search(r"pid (\d+)", out).group(1))  # type: ignore[union-attr]
        assert alive(pid) and demo.poll() is None
        demo.send_signal(signal.SIGINT)
        _, err = demo.communicate(timeout=30)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert demo.returncode == 0, err
    assert "stopped the proxy and the stand-in model" in err
    assert not alive(pid)
    assert not answers(page.split("#")[0])
    # --keep keeps the state directory: the config, the store, the log.
    (kept,) = demo_directories(tmp_path)
    assert {p.name for p in kept.iterdir()} >= {"demo.yml", "proxy.log", "state"}


def test_ctrl_c_while_the_session_runs_stops_the_proxy(tmp_path: Path) -> None:
    demo = launch(tmp_path)
    try:
        deadline = time.monotonic() + 30
        started: list[int] = []
        while not started and time.monotonic() < deadline and demo.poll() is None:
            started = children(demo.pid)
            time.sleep(0.02)
        assert started, "the demo started no proxy"
        demo.send_signal(signal.SIGINT)
        _, err = demo.communicate(timeout=30)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    # 130, or (now and then, with ``python -m``) the interpreter ends itself by SIGINT after the
    # clean-up, as Python does after a KeyboardInterrupt: a shell shows 130 for both.
    assert demo.returncode in (130, -signal.SIGINT), err
    assert "interrupted; stopping what it started" in err
    assert not any(alive(pid) for pid in started)
    assert demo_directories(tmp_path) == []
