"""``compaction-proxy wrap`` around the run: which proxy it trusts with the agent's key, the
signals it passes to the agent, the exit status it reports, what its summary says when nothing
reached a model, and how ``events`` finds a run from any directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_read_tool_output import history
from tests.e2e.test_wrap import ROOT, summary_of, wrap, write_config
from tests.fake_upstream import FakeUpstream, Reply, completion, free_port

pytestmark = pytest.mark.e2e

PATH = {"PATH": os.environ["PATH"]}


@pytest.fixture
def running_proxy(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A proxy of the built-in policies but `full`, serving at a configured port: another
    configuration than the one wrap is given."""
    port = free_port()
    config = tmp_path / "other.yml"
    config.write_text(
        json.dumps({"server": {"port": port}, "policy": "full", "state_dir": str(tmp_path / "other-state")})
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "proxy.cli", "serve", "--config", str(config)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(base + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield base, config
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_a_proxy_of_another_configuration_at_the_address_is_refused(
    running_proxy: tuple[str, Path], tmp_path: Path
) -> None:
    base, _ = running_proxy
    port = int(base.rsplit(":", 1)[1])
    mine = tmp_path / "mine.yml"
    mine.write_text(json.dumps({"server": {"port": port}, "state_dir": str(tmp_path / "state")}))
    marker = tmp_path / "agent-ran"
    ran = wrap(["--config", str(mine), "touch", "--", str(marker)], PATH, tmp_path)
    assert ran.returncode == 1 and not marker.exists()
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1 and "runs another configuration (policy full" in lines[0], ran.stderr
    assert f"--url {base}" in lines[0]
    # Named with --url, it is used, and wrap says which configuration it runs.
    ran = wrap(["--config", str(mine), "--url", base, "--json", "touch", "--", str(marker)], PATH, tmp_path)
    assert ran.returncode == 0 and marker.exists(), ran.stderr
    assert f"using the proxy at {base} as asked (--url): policy full" in ran.stderr
    assert f"not the configuration of {mine}" in ran.stderr
    summary = summary_of(ran.stderr)
    assert summary["shared_proxy"] is True and summary["default_policy"] == "full"


def test_the_same_configurations_proxy_is_used(running_proxy: tuple[str, Path], tmp_path: Path) -> None:
    base, config = running_proxy
    ran = wrap(["--config", str(config), "--json", "true"], PATH, tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert f"using the proxy already running at {base}" in ran.stderr
    assert summary_of(ran.stderr)["proxy_url"] == base


def test_what_is_not_compaction_proxy_never_gets_the_key(upstream: FakeUpstream, tmp_path: Path) -> None:
    # The fake answers every path with 200, /readyz included.
    impostor = upstream.base_url.removesuffix("/v1")
    env = {**PATH, "OPENAI_API_KEY": "sk-secret-0000"}
    script = "import os, sys; sys.exit(0)"
    ran = wrap(["--url", impostor, sys.executable, "--", "-c", script], env, tmp_path)
    assert ran.returncode == 1
    assert ran.stderr.strip() == (
        "compaction-proxy: something that is not compaction-proxy (it answered /readyz with 200) "
        f"answers at {impostor}: the agent's key is not sent there"
    )
    assert [r.path for r in upstream.requests] == ["/readyz"]
    assert not any("authorization" in r.headers for r in upstream.requests)


SIGNAL_AGENT = """
import os, signal, sys, time
out = sys.argv[1]
def note(text):
    with open(out, "a") as f:
        f.write(text + "\\n")
def caught(signum, frame):
    note(f"got {signum}")
    sys.exit(40 + signum)
# Python leaves a SIGINT it inherited ignored as ignored: this says what it inherited.
note("sigint " + ("ignored" if signal.getsignal(signal.SIGINT) == signal.SIG_IGN else "default"))
if sys.argv[2] == "catch":
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, caught)
note("ready " + os.environ["OPENAI_BASE_URL"])
time.sleep(60)
"""


def proxy_pids(port: int) -> list[int]:
    """The PIDs of `serve` processes listening on ``port`` (from /proc: Linux)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"serve" in argv and str(port).encode() in argv:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in status


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads proxy PIDs from /proc (Linux)")
@pytest.mark.parametrize(
    ("sent", "mode", "status"),
    [
        (signal.SIGTERM, "catch", 40 + signal.SIGTERM),
        (signal.SIGHUP, "catch", 40 + signal.SIGHUP),
        (signal.SIGTERM, "default", 128 + signal.SIGTERM),
        (signal.SIGINT, "default", 128 + signal.SIGINT),
    ],
)
def test_signals_to_wrap_reach_the_agent_and_stop_the_proxy(
    tmp_path: Path, sent: signal.Signals, mode: str, status: int
) -> None:
    out = tmp_path / "agent.out"
    config = write_config(tmp_path, {})
    command = [sys.executable, "-m", "proxy.cli", "wrap", "--config", str(config), sys.executable]
    command += ["--", "-c", SIGNAL_AGENT, str(out), mode]
    env = {**PATH, "XDG_STATE_HOME": str(tmp_path / "state-home"), "PYTHONPATH": str(ROOT)}
    # Its own process group, as a shell's job: the signal goes to wrap alone, as `kill` sends it.
    process = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while "ready" not in (out.read_text() if out.exists() else ""):
            assert time.monotonic() < deadline and process.poll() is None, process.stderr
            time.sleep(0.1)
        port = int(out.read_text().split("ready ")[1].split(":")[2].split("/")[0])
        pids = proxy_pids(port)
        assert len(pids) == 1
        process.send_signal(sent)
        assert process.wait(timeout=30) == status
    finally:
        if process.poll() is None:
            process.kill()
    said = out.read_text()
    assert said.startswith("sigint default"), said  # not inherited as ignored
    if mode == "catch":
        assert f"got {int(sent)}" in said
    deadline = time.monotonic() + 15
    while alive(pids[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pids[0])


def test_an_agent_a_signal_ends_exits_as_a_shell_says(tmp_path: Path) -> None:
    config = write_config(tmp_path, {})
    ran = wrap(["--config", str(config), "sh", "--", "-c", "kill -KILL $$"], PATH, tmp_path)
    assert ran.returncode == 128 + signal.SIGKILL, ran.stderr


def test_the_summary_says_when_the_agent_sent_nothing(tmp_path: Path) -> None:
    config = write_config(tmp_path, {})
    ran = wrap(["--config", str(config), "true"], PATH, tmp_path)
    assert ran.returncode == 0
    assert "the agent sent no request to the proxy in session wrap-" in ran.stderr
    assert "likely not pointed at it" in ran.stderr and "nothing was compacted" not in ran.stderr


def test_the_summary_counts_404s_and_says_nothing_reached_a_model(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    config = write_config(tmp_path, {"upstream": {"base_url": upstream.base_url}})
    missing = {"error": {"message": "The model does not exist", "type": "invalid_request_error"}}
    upstream.queue(Reply(status=404, body=missing), Reply(status=404, body=missing))
    script = (
        "import os, openai\n"
        "c = openai.OpenAI(base_url=os.environ['OPENAI_BASE_URL'], api_key='sk-x', max_retries=0)\n"
        "for _ in range(2):\n"
        "    try: c.chat.completions.create(model='no-such', messages=[{'role': 'user', 'content': 'hi'}])\n"
        "    except openai.NotFoundError: pass\n"
    )
    ran = wrap(["--config", str(config), sys.executable, "--", "-c", script], PATH, tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "errors: 2 of 2 answers were not 2xx (2 4xx)" in ran.stderr
    assert "every request failed: nothing reached a model" in ran.stderr
    assert "nothing was compacted" not in ran.stderr


def test_events_find_a_wrap_run_from_any_directory(upstream: FakeUpstream, tmp_path: Path) -> None:
    # The default state directory (./var): relative, so only the run's record says where it is.
    settings = {"context_windows": {"default": 8192}, "upstream": {"base_url": upstream.base_url}}
    config = write_config(tmp_path, settings, state_dir=False)
    upstream.queue(Reply(body=completion("first")))
    script = (
        "import json, os, sys, openai\n"
        "c = openai.OpenAI(base_url=os.environ['OPENAI_BASE_URL'], api_key='sk-x', max_retries=0)\n"
        "c.chat.completions.create(model='gpt-4o', messages=json.loads(sys.argv[1]))\n"
    )
    ran = wrap(
        ["--config", str(config), "--json", sys.executable, "--", "-c", script, json.dumps(history())],
        PATH,
        tmp_path,
    )
    summary = summary_of(ran.stderr)
    assert ran.returncode == 0 and summary["compaction_points"] >= 1, ran.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**PATH, "XDG_STATE_HOME": str(tmp_path / "state-home"), "PYTHONPATH": str(ROOT)}
    found = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "events", "--session", summary["session"]],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert found.returncode == 0, found.stderr
    assert f"reading the store of wrap run {summary['session']}" in found.stderr
    assert found.stdout.strip()
    assert not (elsewhere / "var").exists()
