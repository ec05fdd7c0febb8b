"""The first hour at the command line: --version, faults at start as one line with the fix,
the container health check, and `events` given the client's own session id."""

from __future__ import annotations

import asyncio
import http.server
import importlib.metadata
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.cli import main
from proxy.commands.preflight import check_state_dir, redact_url
from proxy.state.sessions import explicit_session
from proxy.state.sqlite_store import SQLiteStore
from tests.fake_upstream import free_port


def one_line_failure(err: str) -> str:
    assert "Traceback" not in err and "ExceptionGroup" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("compaction-proxy: ")
    return lines[0]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    expected = f"compaction-proxy {importlib.metadata.version('compaction-proxy')}"
    assert capsys.readouterr().out.strip() == expected


def config(tmp_path: Path, text: str = "") -> str:
    path = tmp_path / "my.yml"
    path.write_text(f"state_dir: {tmp_path / 'var'}\n" + text)
    return str(path)


def test_a_port_in_use_is_one_line_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--config", config(tmp_path), "--port", str(port)]) == 1
    captured = capsys.readouterr()
    line = one_line_failure(captured.err)
    assert f"127.0.0.1:{port}" in line and "already in use" in line and "--port" in line
    assert "started" not in captured.out + captured.err


def test_an_address_this_machine_lacks_says_which_to_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--config", config(tmp_path), "--host", "192.0.2.1", "--port", "18080"]) == 1
    line = one_line_failure(capsys.readouterr().err)
    assert "no such address" in line and "0.0.0.0" in line


def test_redis_down_at_start_is_one_line_without_its_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dead = free_port()
    path = config(tmp_path, f"store: {{backend: redis, redis_url: 'redis://:hunter2@127.0.0.1:{dead}/0'}}\n")
    assert main(["serve", "--config", path, "--port", str(free_port())]) == 1
    line = one_line_failure(capsys.readouterr().err)
    assert f"redis://:***@127.0.0.1:{dead}/0" in line and "not reachable" in line
    assert "hunter2" not in line


def test_an_unwritable_state_dir_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a-file").write_text("")
    path = tmp_path / "my.yml"
    path.write_text(f"state_dir: {tmp_path / 'a-file' / 'var'}\n")
    assert main(["serve", "--config", str(path), "--port", str(free_port())]) == 1
    line = one_line_failure(capsys.readouterr().err)
    assert "state directory" in line and "not writable" in line and "state_dir" in line


def test_a_corrupt_database_at_start_is_one_line_and_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "var"
    state.mkdir(mode=0o700)
    garbage = b"not a database, but an operator's data all the same\n" * 200
    (state / "compaction.db").write_bytes(garbage)
    path = tmp_path / "my.yml"
    path.write_text(f"state_dir: {state}\n")
    assert main(["serve", "--config", str(path), "--port", str(free_port())]) == 1
    line = one_line_failure(capsys.readouterr().err)
    assert "compaction.db cannot be read" in line and "move it aside" in line
    assert (state / "compaction.db").read_bytes() == garbage  # never set aside or rewritten silently


def serve_with_state(tmp_path: Path, state: Path) -> int:
    path = tmp_path / "my.yml"
    path.write_text(f"state_dir: {state}\n")
    return main(["serve", "--config", str(path), "--port", str(free_port())])


def test_a_state_directory_others_can_write_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It holds every saved output and event: a group- or world-writable directory would let
    another user replace the database. Refused in one line with the fix, nothing changed."""
    state = tmp_path / "shared-var"
    state.mkdir()
    state.chmod(0o775)
    assert serve_with_state(tmp_path, state) == 1
    line = one_line_failure(capsys.readouterr().err)
    assert "can be written by other users (mode 775)" in line and f"chmod 700 {state}" in line
    assert not (state / "compaction.db").exists()


def test_a_symlinked_state_directory_is_followed_and_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "data"
    target.mkdir(mode=0o700)
    link = tmp_path / "var"
    link.symlink_to(target)
    target.chmod(0o777)
    assert serve_with_state(tmp_path, link) == 1
    line = one_line_failure(capsys.readouterr().err)
    assert f"the state directory {target} can be written by other users (mode 777)" in line
    target.chmod(0o700)
    (target / "compaction.db").symlink_to(tmp_path / "elsewhere.db")
    assert serve_with_state(tmp_path, link) == 1
    line = one_line_failure(capsys.readouterr().err)
    assert f"{target / 'compaction.db'} is a symbolic link" in line
    assert not (tmp_path / "elsewhere.db").exists()  # nothing written where the link led
    (target / "compaction.db").unlink()
    check_state_dir(str(link))  # an owner-only directory behind a link is fine


def test_redact_url_keeps_everything_but_the_password() -> None:
    assert redact_url("redis://user:pw@host:6380/2") == "redis://user:***@host:6380/2"
    assert redact_url("redis://host:6379/0") == "redis://host:6379/0"


class Ready(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/readyz" else 404)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def ready_server() -> Iterator[http.server.HTTPServer]:
    server = http.server.HTTPServer(("127.0.0.1", 0), Ready)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_healthcheck_follows_the_configured_port(
    tmp_path: Path,
    ready_server: http.server.HTTPServer,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = ready_server.server_address[1]
    path = config(tmp_path, f"server: {{host: 0.0.0.0, port: {port}}}\n")
    assert main(["healthcheck", "--config", path]) == 0
    assert f"http://127.0.0.1:{port}/readyz: 200" in capsys.readouterr().out
    # The port from the environment, as in the container image.
    monkeypatch.setenv("COMPACTION_PROXY_PORT", str(port))
    assert main(["healthcheck", "--config", config(tmp_path)]) == 0
    monkeypatch.setenv("COMPACTION_PROXY_PORT", str(free_port()))
    assert main(["healthcheck", "--config", config(tmp_path)]) == 1
    assert "not answering" in capsys.readouterr().out


def test_healthcheck_fails_while_not_ready(
    tmp_path: Path, ready_server: http.server.HTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Ready, "status", 503)
    port = ready_server.server_address[1]
    assert main(["healthcheck", "--config", config(tmp_path), "--port", str(port)]) == 1


def add_events(db: Path, items: list[tuple[str, str, str]]) -> None:
    async def write() -> None:
        store = SQLiteStore(db)
        for number, (tenant, session, policy) in enumerate(items):
            event = {
                "event_id": f"ev_{number}",
                "time": 1_000_000.0 + number,
                "tenant": tenant,
                "session": session,
                "policy": policy,
            }
            await store.add_event(tenant, f"{session}:{policy}", event)
        await store.close()

    asyncio.run(write())


def test_events_takes_the_clients_session_id(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = config(tmp_path)
    add_events(
        tmp_path / "var" / "compaction.db",
        [
            ("t_a", explicit_session("t_a", "run-1"), "improved"),
            ("t_b", explicit_session("t_b", "run-1"), "improved"),  # another key, the same id
            ("t_a", explicit_session("t_a", "run-2"), "improved"),
            ("t_a", explicit_session("t_a", "run-1"), "sre"),
        ],
    )
    assert main(["events", "--config", path, "--session", "run-1"]) == 0
    assert [line.count('"ev_') for line in capsys.readouterr().out.splitlines()] == [1, 1, 1]
    assert main(["events", "--config", path, "--session", "run-1", "--tenant", "t_a"]) == 0
    printed = capsys.readouterr().out
    assert '"ev_0"' in printed and '"ev_3"' in printed and '"ev_1"' not in printed
    internal = explicit_session("t_a", "run-2")
    assert main(["events", "--config", path, "--session", internal]) == 0
    assert '"ev_2"' in capsys.readouterr().out


def test_events_says_why_nothing_matched(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = config(tmp_path)
    (tmp_path / "var").mkdir()
    assert main(["events", "--config", path, "--session", "run-1"]) == 1
    assert "no store at" in capsys.readouterr().err  # and none is made
    assert not (tmp_path / "var" / "compaction.db").exists()
    add_events(tmp_path / "var" / "compaction.db", [])
    assert main(["events", "--config", path, "--session", "run-1"]) == 1
    err = capsys.readouterr().err
    assert "no events in the store" in err and "record_skipped" in err and "compaction.db" in err
    add_events(tmp_path / "var" / "compaction.db", [("t_a", explicit_session("t_a", "run-1"), "improved")])
    assert main(["events", "--config", path, "--session", "run-9"]) == 1
    err = capsys.readouterr().err
    assert "no events match session 'run-9'" in err and "its own tenant" in err
    assert main(["events", "--config", path, "--policy", "sre"]) == 1
    assert "no events match policy 'sre'" in capsys.readouterr().err
