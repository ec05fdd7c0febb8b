"""``compaction-proxy events``: newest first; a table on a terminal (or with ``--table``),
JSON lines when piped (or with ``--json``); ``--follow`` oldest first, new events below."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.cli import main
from proxy.commands.events_table import EventPrinter, row
from proxy.state.sessions import explicit_session
from proxy.state.sqlite_store import SQLiteStore
from tests.conftest import ROOT

T0 = 1_700_000_000.0


def event(number: int, **more: Any) -> dict[str, Any]:
    return {
        "event_id": f"ev_{number:04d}",
        "time": T0 + number,
        "tenant": "t_a",
        "session": explicit_session("t_a", "run-1") + ":improved",
        "policy": "improved",
        "trigger": "threshold" if number % 2 else None,
        "tokens_before": 120_000 + number,
        "tokens_after": 30_000,
        "handles_offloaded": ["out_1", "out_2"],
        "read_tool_output": {"rounds": 1, "reads": [{"handle": "out_1"}]},
        "client_session": "run-1",
        **more,
    }


def store_with(tmp_path: Path, events: list[dict[str, Any]]) -> str:
    async def write() -> None:
        store = SQLiteStore(tmp_path / "var" / "compaction.db")
        for e in events:
            await store.add_event(e["tenant"], e["session"], e)
        await store.close()

    (tmp_path / "var").mkdir(exist_ok=True, mode=0o700)
    asyncio.run(write())
    path = tmp_path / "my.yml"
    path.write_text(f"state_dir: {tmp_path / 'var'}\n")
    return str(path)


def ids(out: str) -> list[str]:
    return [orjson.loads(line)["event_id"] for line in out.splitlines()]


def test_piped_it_prints_json_lines_newest_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = store_with(tmp_path, [event(n) for n in range(5)])
    assert main(["events", "--config", path]) == 0
    assert ids(capsys.readouterr().out) == ["ev_0004", "ev_0003", "ev_0002", "ev_0001", "ev_0000"]
    # --limit keeps the newest, with the client's id and without a tenant too.
    for argv in (["--limit", "2"], ["--limit", "2", "--session", "run-1"], ["--limit", "2", "--json"]):
        assert main(["events", "--config", path, *argv]) == 0
        assert ids(capsys.readouterr().out) == ["ev_0004", "ev_0003"]


def test_the_table_on_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = event(9, client_session=None, session="s_0123456789abcdef0123:sre", policy="sre")
    other.pop("client_session")
    own = {"input_tokens": 12_000, "output_tokens": 900}
    path = store_with(tmp_path, [event(1, compaction_cost=own), other])
    assert main(["events", "--config", path, "--table"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = ["TIME", "SESSION", "POLICY", "TRIGGER", "TOKENS", "BEFORE", "->", "AFTER", "READS", "OFFLOADED"]
    assert lines[0].split() == [*header, "OWN", "TOKENS"]
    assert lines[1].split()[2:] == [
        "s_01234567…",
        "sre",
        "threshold",
        "120,009",
        "->",
        "30,000",
        "1",
        "2",
        "-",
    ]
    # The compaction's own cost: the summarizer's input/output tokens, apart from the prompt.
    row_1 = ["run-1", "improved", "threshold", "120,001", "->", "30,000", "1", "2", "12,000/900"]
    assert lines[2].split()[2:] == row_1
    assert lines[1].split()[:2] == time.strftime("%m-%d %H:%M:%S", time.localtime(T0 + 9)).split()
    # Every row lines up under the header.
    assert lines[0].index("POLICY") == lines[1].index("sre") == lines[2].index("improved")


def test_a_hostile_client_id_is_one_bounded_cell() -> None:
    cells = row(event(1, client_session="\x1b[2J" + "x" * 500 + "\n"))
    assert cells[1].startswith("?[2Jx") and len(cells[1]) <= 128
    out = io.StringIO()
    EventPrinter(out, table=True).write([event(1, client_session="a\nb")])
    assert len(out.getvalue().splitlines()) == 2


def test_on_a_terminal_it_is_a_table(tmp_path: Path) -> None:
    """A pseudo-terminal as stdout: the table without --table; --json still JSON lines."""
    pty = pytest.importorskip("pty")
    path = store_with(tmp_path, [event(n) for n in range(3)])

    def run(*extra: str) -> str:
        command = [sys.executable, "-m", "proxy.cli", "events", "--config", path, *extra]
        leader, follower = pty.openpty()
        done = subprocess.run(
            command, stdout=follower, stderr=subprocess.PIPE, cwd=ROOT, timeout=60, check=False
        )
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(leader)
        assert done.returncode == 0, done.stderr
        return b"".join(chunks).decode().replace("\r\n", "\n")

    table = run().splitlines()
    assert table[0].startswith("TIME") and "ev_" not in "".join(table) and len(table) == 4
    assert ids(run("--json")) == ["ev_0002", "ev_0001", "ev_0000"]


def test_follow_prints_oldest_first_then_new_events_below(tmp_path: Path) -> None:
    path = store_with(tmp_path, [event(n) for n in range(3)])
    command = [sys.executable, "-m", "proxy.cli", "events", "--config", path, "--follow", "--limit", "2"]
    command += ["--interval", "0.1"]
    follower = subprocess.Popen(command, stdout=subprocess.PIPE, cwd=ROOT)
    try:
        assert follower.stdout is not None
        first = [orjson.loads(follower.stdout.readline())["event_id"] for _ in range(2)]
        assert first == ["ev_0001", "ev_0002"]
        later = threading.Thread(target=store_with, args=(tmp_path, [event(n) for n in (3, 4)]))
        later.start()
        later.join()
        after = [orjson.loads(follower.stdout.readline())["event_id"] for _ in range(2)]
        assert after == ["ev_0003", "ev_0004"]
    finally:
        follower.terminate()
        follower.wait(timeout=10)


def test_events_where_no_proxy_ran_says_so_and_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from proxy.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COMPACTION_PROXY_CONFIG", raising=False)
    assert main(["events"]) == 1
    assert "no store at var/compaction.db" in capsys.readouterr().err
    assert not (tmp_path / "var").exists()


def test_a_preparations_own_event_is_a_row_that_says_so() -> None:
    from proxy.commands.events_table import row

    prepared = {"time": T0, "session": "s_1:improved", "policy": "improved", "kind": "preparation"}
    prepared["compaction_cost"] = {"input_tokens": 1_000, "output_tokens": 100}
    assert row(prepared)[2:] == ["improved", "prepared", "- -> -", "0", "0", "1,000/100"]
