"""Hardening, round 2: no client can stall, cross or crash the proxy. One test per attack of the
issue's table (and a few more), against the real proxy with ``improved`` and a small window."""

from __future__ import annotations

import base64
import os
import re
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.fake_upstream import FakeUpstream, Recorded, Reply, completion

pytestmark = pytest.mark.e2e

WINDOW = 4096
CONFIG: dict[str, Any] = {"policy": "improved", "context_windows": {"default": WINDOW}}
HANDLE = re.compile(r"handle=(out_[0-9a-f]+)")


def history(output: str, steps: int = 6, marker: str = "A") -> list[Any]:
    messages: list[Any] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"Fix it ({marker})."},
    ]
    for i in range(steps):
        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{i}",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"command": "x"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"{marker}{i} {output}"},
        ]
    return messages


def read_call(handle: str, call_id: str = "r1", **arguments: Any) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {
            "name": "read_tool_output",
            "arguments": orjson.dumps({"handle": handle, **arguments}).decode(),
        },
    }


def reads(**arguments: Any) -> Reply:
    def decide(request: Recorded) -> Reply:
        handle = HANDLE.findall(request.body.decode())[0]
        return Reply(body=completion(tool_calls=[read_call(handle, **arguments)]))

    return Reply(dynamic=decide)


def chat(proxy: Any, messages: list[Any], key: str | None = "sk-hardening-a", **extra: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    headers.update(extra.pop("headers", {}))
    return httpx.post(
        proxy.base_url + "/chat/completions",
        json={"model": "m", "messages": messages},
        headers=headers,
        timeout=60,
        **extra,
    )


# --- 1: a backtracking pattern -------------------------------------------------------------


def test_a_catastrophic_pattern_never_holds_the_event_loop(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy({**CONFIG, "context_windows": {"default": 16_000}})
    lines = "\n".join("a" * 32 + "!" for _ in range(2000))
    upstream.queue(reads(pattern="(a+)+$"), Reply(body=completion("done")))
    result: dict[str, Any] = {}
    messages = history(lines, steps=1) + history("filler " * 1500, steps=6)[2:]

    def run() -> None:
        result["response"] = chat(proxy, messages)

    worker = threading.Thread(target=run)
    worker.start()
    health = [httpx.get(proxy.url + "/healthz", timeout=10) for _ in range(20)]
    worker.join(60)
    assert all(r.status_code == 200 for r in health)
    assert result["response"].status_code == 200
    read_result = upstream.requests[-1].json()["messages"][-1]["content"]
    assert "0 matching line(s)" in read_result


def test_patterns_are_re2_and_say_what_they_do_not_support(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy({**CONFIG, "context_windows": {"default": 16_000}})
    upstream.queue(reads(pattern=r"(a)\1"), Reply(body=completion("done")))
    assert chat(proxy, history("aa " * 6000)).status_code == 200
    assert "RE2 syntax" in upstream.requests[-1].json()["messages"][-1]["content"]


# --- 2, 3: identity --------------------------------------------------------------------------

UPSTREAM_KEY = "sk-configured-upstream-0000000000"


def test_clients_without_a_credential_are_refused_when_an_upstream_key_is_set(
    start_proxy: Any, upstream: FakeUpstream
) -> None:
    proxy = start_proxy({**CONFIG, "upstream": {"api_key": UPSTREAM_KEY}})
    refused = chat(proxy, history("x" * 3000), key=None)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "missing_api_key"
    assert upstream.requests == []
    assert httpx.get(proxy.base_url + "/models").status_code == 401
    events = httpx.get(proxy.base_url + "/compaction/events")
    assert events.status_code == 401


def test_anonymous_clients_share_one_tenant_only_when_the_operator_opts_in(
    start_proxy: Any, upstream: FakeUpstream
) -> None:
    proxy = start_proxy(
        {**CONFIG, "upstream": {"api_key": UPSTREAM_KEY}, "server": {"allow_anonymous": True}}
    )
    assert chat(proxy, history("x" * 3000), key=None).status_code == 200
    assert upstream.requests[-1].headers["authorization"] == f"Bearer {UPSTREAM_KEY}"


@pytest.mark.parametrize(
    "kind",
    ["api-key", "x-api-key", "basic", "other-scheme"],
)
def test_every_credential_is_its_own_tenant(start_proxy: Any, upstream: FakeUpstream, kind: str) -> None:
    def credential(owner: str) -> dict[str, str]:
        if kind == "basic":
            return {"authorization": "Basic " + base64.b64encode(f"{owner}:secret".encode()).decode()}
        if kind == "other-scheme":
            return {"authorization": f"Token key-of-{owner}-0000"}
        return {kind: f"key-of-{owner}-000000000"}

    proxy = start_proxy({**CONFIG, "upstream": {"api_key": UPSTREAM_KEY}})
    upstream.queue(Reply(body=completion("a done")))
    assert (
        chat(proxy, history("SECRET OF A " * 300), key=None, headers=credential("alice")).status_code == 200
    )
    handle_of_a = HANDLE.findall(upstream.requests[-1].body.decode())[0]

    def read_a(request: Recorded) -> Reply:
        return Reply(body=completion(tool_calls=[read_call(handle_of_a)]))

    upstream.queue(Reply(dynamic=read_a), Reply(body=completion("b done")))
    response = chat(proxy, history("other " * 1200, marker="B"), key=None, headers=credential("bob"))
    assert response.status_code == 200
    assert "no saved output" in upstream.requests[-1].json()["messages"][-1]["content"]
    # The configured key is never added to a request that carries a credential of its own.
    for request in upstream.requests:
        assert UPSTREAM_KEY not in request.headers.get("authorization", "")


# --- 4: paths ------------------------------------------------------------------------------


@pytest.mark.parametrize("client", ["builtin", "aiohttp", "httpx"])
@pytest.mark.parametrize("with_path", [True, False])
@pytest.mark.parametrize(
    "path",
    [
        "/v1%2F@{other}/v1/models",
        "/v1%2f@{other}/v1/models",
        "/v1/%2F%2F{other}/v1/models",
        "/v1/..%2F..%2Fadmin",
        "/v1//{other}/v1/models",
        "/v1/\\\\{other}/v1/models",
        "/v1%40{other}/v1/models",
        "/v1/models%5C..%5C..",
    ],
)
def test_the_upstream_host_can_never_change(
    start_proxy: Any, upstream: FakeUpstream, client: str, with_path: bool, path: str
) -> None:
    other = FakeUpstream().start()
    try:
        # The usual /v1, or another prefix (a bare host is refused by the configuration check).
        base = upstream.base_url if with_path else f"http://127.0.0.1:{upstream.port}/api"
        proxy = start_proxy({"upstream": {"base_url": base, "api_key": UPSTREAM_KEY, "http_client": client}})
        raw = path.format(other=f"127.0.0.1:{other.port}").encode()
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
            sock.sendall(
                b"GET " + raw + b" HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer sk-client\r\n\r\n"
            )
            answer = sock.recv(65536)
        status = int(answer.split(b" ", 2)[1])
        assert status in (400, 404), answer[:200]
        assert other.requests == []
        assert all(UPSTREAM_KEY not in r.headers.get("authorization", "") for r in upstream.requests)
    finally:
        other.stop()


# --- 5: malformed messages in a history long enough to compact -------------------------------


@pytest.mark.parametrize(
    "damage",
    [
        lambda m: m[3].__setitem__("tool_call_id", ["c0"]),
        lambda m: m[2]["tool_calls"][0].__setitem__("function", "bash"),
        lambda m: m.insert(5, None),
        lambda m: m[4].__setitem__("content", {"text": 1}),
        lambda m: m[2].__setitem__("tool_calls", "bash"),
    ],
    ids=["tool_call_id-list", "function-string", "null-message", "content-object", "tool_calls-string"],
)
def test_malformed_messages_never_get_a_500(start_proxy: Any, upstream: FakeUpstream, damage: Any) -> None:
    proxy = start_proxy(CONFIG)
    messages = history("output " * 400, steps=8)
    damage(messages)
    response = chat(proxy, messages)
    assert response.status_code == 200
    assert upstream.requests[-1].json()["messages"] == messages  # forwarded as sent
    assert response.headers["x-compaction-skipped"].startswith("messages[")


def test_integers_past_pythons_digit_limit_are_forwarded_as_sent(proxy: Any, upstream: FakeUpstream) -> None:
    body = b'{"model": "m", "seed": ' + b"9" * 5000 + b', "messages": [{"role": "user", "content": "hi"}]}'
    response = httpx.post(
        proxy.base_url + "/chat/completions",
        content=body,
        headers={"content-type": "application/json", "authorization": "Bearer k"},
    )
    assert response.status_code == 200
    assert upstream.requests[-1].body == body


# --- 7: many reads of a huge one-line output -------------------------------------------------


def test_fifty_reads_of_a_huge_line_stay_bounded(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy({**CONFIG, "context_windows": {"default": 128_000}, "read_tool": {"max_rounds": 4}})
    line = "z" * 1_200_000

    def fifty(request: Recorded) -> Reply:
        handles = HANDLE.findall(request.body.decode())
        return Reply(body=completion(tool_calls=[read_call(handles[0], f"r{i}") for i in range(50)]))

    upstream.queue(*(Reply(dynamic=fifty) for _ in range(4)), Reply(body=completion("done")))
    messages = history("small", steps=3)
    messages[3]["content"] = line
    messages += history("filler " * 4000, steps=6)[2:]
    response = chat(proxy, messages)
    assert response.status_code == 200
    sizes = [len(r.body) for r in upstream.requests]
    first = sizes[0]
    # Every later round adds at most the per-request read budget (256 KiB by default).
    assert all(size - first <= 300_000 for size in sizes), sizes


# --- 8: a full disk ------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Any:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.system(f"mount -t tmpfs -o size=4m tmpfs {mount}") != 0:
        pytest.skip("this machine does not allow mounting a tmpfs")
    yield mount
    os.system(f"umount -l {mount}")


def fill(disk: Path) -> None:
    """Fill the disk to its last byte."""
    descriptor = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (65536, 4096, 1):
            try:
                while os.write(descriptor, b"\0" * chunk):
                    pass
            except OSError:
                continue
    finally:
        os.close(descriptor)


def test_reads_and_every_store_path_fail_open_on_a_full_disk(
    start_proxy: Any, upstream: FakeUpstream, small_disk: Path
) -> None:
    jsonl = small_disk / "events.jsonl"
    proxy = start_proxy({**CONFIG, "events": {"jsonl_path": str(jsonl)}}, state_dir=small_disk / "state")
    upstream.queue(Reply(body=completion("first")))
    assert (
        chat(proxy, history("saved before the disk filled " * 200), headers={"x-session-id": "d"}).status_code
        == 200
    )
    fill(small_disk)
    # A stored output is still read (its last_used update fails quietly), stream or not.
    upstream.queue(reads(num_lines=3), Reply(body=completion("read it")))
    longer = [*history("saved before the disk filled " * 200), {"role": "assistant", "content": "ok"}]
    longer.append({"role": "user", "content": "go on"})
    response = chat(proxy, longer, headers={"x-session-id": "d"})
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == "read it"
    assert "lines 1-" in upstream.requests[-1].json()["messages"][-1]["content"]
    upstream.queue(Reply(body=completion("fresh")))
    # New outputs cannot be stored: the request goes through uncompacted, never a handle unstored.
    fresh = chat(proxy, history("new output on a full disk " * 80, marker="Z"))
    assert fresh.status_code == 200
    assert "handle=" not in upstream.requests[-1].body.decode()
    assert httpx.get(proxy.url + "/healthz").status_code == 200


def test_a_full_disk_under_the_events_file_alone_costs_only_its_lines(
    start_proxy: Any, upstream: FakeUpstream, small_disk: Path, tmp_path: Path
) -> None:
    """The state directory has room, the events file's disk is full: answers and compaction go
    on, the event is in the store (the events API lists it), the lost lines are counted, and
    the file keeps whole lines only (a line the disk had no room for is taken back)."""
    jsonl = small_disk / "events.jsonl"
    proxy = start_proxy({**CONFIG, "events": {"jsonl_path": str(jsonl)}}, state_dir=tmp_path / "state")
    upstream.queue(Reply(body=completion("before")))
    assert chat(
        proxy, history("written while there was room " * 200), headers={"x-session-id": "e1"}
    ).is_success
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (jsonl.exists() and jsonl.read_bytes().endswith(b"\n")):
        time.sleep(0.05)  # events are written in the background
    fill(small_disk)
    before = jsonl.read_bytes()
    for turn in range(3):
        upstream.queue(Reply(body=completion(f"full {turn}")))
        answer = chat(proxy, history(f"a full disk, turn {turn} " * 200, marker=f"F{turn}"))
        assert answer.status_code == 200 and answer.headers["x-compaction-trigger"] == "threshold"
        assert "handle=" in upstream.requests[-1].body.decode()  # the store still works
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and 'compaction_proxy_errors_total{kind="event"} 3.0' not in (
        metrics := httpx.get(proxy.url + "/metrics").text
    ):
        time.sleep(0.1)
    assert 'compaction_proxy_errors_total{kind="event"} 3.0' in metrics
    listed = httpx.get(
        proxy.base_url + "/compaction/events", headers={"authorization": "Bearer sk-hardening-a"}, timeout=10
    ).json()["data"]
    assert len(listed) == 4
    after = jsonl.read_bytes()
    assert after == before and after.endswith(b"\n")
    assert all(orjson.loads(line) for line in after.splitlines())


# --- 9: header size and slow clients --------------------------------------------------------


def test_oversized_headers_get_431(start_proxy: Any) -> None:
    proxy = start_proxy({"server": {"max_header_bytes": 8192}})
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\nx-big: ")
        with pytest.raises(OSError):
            for _ in range(2000):
                sock.sendall(b"a" * 65536)
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 431")


def test_slow_clients_are_cut_off(start_proxy: Any) -> None:
    proxy = start_proxy({"server": {"header_timeout_seconds": 1.0, "body_timeout_seconds": 1.0}})
    sockets = []
    for _ in range(50):
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\n")
        sockets.append(sock)
    body_sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    body_sock.sendall(
        b"POST /v1/models HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
        b"content-length: 100\r\n\r\n{"
    )
    time.sleep(2.5)
    for sock in [*sockets, body_sock]:
        data = sock.recv(4096)
        assert data.startswith(b"HTTP/1.1 408") or data == b""
        assert sock.recv(4096) == b""  # closed
        sock.close()
    assert httpx.get(proxy.url + "/healthz").status_code == 200


# --- 10: files at rest ----------------------------------------------------------------------


def test_every_file_at_rest_is_owner_only_from_the_first_start(
    start_proxy: Any, upstream: FakeUpstream, tmp_path: Path
) -> None:
    jsonl = tmp_path / "events" / "events.jsonl"
    proxy = start_proxy({**CONFIG, "events": {"jsonl_path": str(jsonl)}}, state_dir=tmp_path / "state")
    chat(proxy, history("to offload " * 400))
    deadline = time.monotonic() + 10
    while not jsonl.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    files = [
        tmp_path / "state" / name for name in ("compaction.db", "compaction.db-wal", "compaction.db-shm")
    ]
    for path in [*files, jsonl]:
        if path.exists():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert jsonl.exists() and (tmp_path / "state" / "compaction.db-wal").exists()


# --- 6: large bodies ------------------------------------------------------------------------


def test_large_bodies_are_compacted_off_the_event_loop(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy({**CONFIG, "server": {"large_request_messages": 100}})
    big = history("x " * 200, steps=1500)  # 3,002 messages: over the limit, to a worker process
    result: dict[str, Any] = {}

    def run() -> None:
        result["response"] = chat(proxy, big, headers={"x-session-id": "big"})

    worker = threading.Thread(target=run)
    worker.start()
    # The event loop answers while the worker process parses, counts and compacts.
    health = httpx.get(proxy.url + "/healthz", timeout=10)
    small = chat(proxy, history("y", steps=2))
    worker.join(120)
    assert health.status_code == 200 and small.status_code == 200
    response = result["response"]
    assert response.status_code == 200 and response.headers["x-compaction-trigger"]
    sent = [r for r in upstream.requests if b"x x x x" in r.body]
    assert sent and len(sent[-1].json()["messages"]) < len(big)
    assert int(response.headers["x-compaction-tokens-after"]) <= WINDOW
    events = httpx.get(
        proxy.base_url + "/compaction/events",
        params={"session": "big"},
        headers={"authorization": "Bearer sk-hardening-a"},
    ).json()["data"]
    assert events and events[-1]["details"]["large_request"]["worker_process"] is True
    # The same session goes on from the worker's checkpoint: the prefix sent is stable.
    longer = [*big, {"role": "assistant", "content": "Thinking."}, {"role": "user", "content": "Go on."}]
    again = chat(proxy, longer, headers={"x-session-id": "big"})
    assert again.status_code == 200 and "x-compaction-trigger" not in again.headers
    first_view = sent[-1].json()["messages"]
    assert upstream.requests[-1].json()["messages"][: len(first_view)] == first_view


def test_a_large_agent_compaction_request_is_decided_as_a_small_one(
    start_proxy: Any, upstream: FakeUpstream
) -> None:
    """An agent's own compaction request goes as sent when it fits, whatever its size: the
    worker process recognizes it and the parent decides with the window (one rule; before, a
    body over the limit got no such decision, no header and no note)."""
    proxy = start_proxy({**CONFIG, "server": {"large_request_messages": 100}})
    prompt = "Your task is to create a detailed summary of the conversation so far."
    messages = [*history("ok", steps=60), {"role": "user", "content": prompt}]  # 123 messages
    response = chat(proxy, messages, headers={"x-session-id": "agent-compacts"})
    assert response.status_code == 200
    assert response.headers["x-compaction-skipped"] == "claude-code's own compaction request"
    assert upstream.requests[-1].json()["messages"] == messages  # as the agent sent it
    time.sleep(0.3)  # the event is written once the response is out
    events = httpx.get(
        proxy.base_url + "/compaction/events", headers={"authorization": "Bearer sk-hardening-a"}
    ).json()["data"]
    assert events[-1]["dialect_notes"]["agent_compaction"] == {
        "agent": "claude-code",
        "action": "forwarded as sent",
    }


def test_large_malformed_or_hostile_bodies_get_the_same_answers(proxy: Any, upstream: FakeUpstream) -> None:
    many = b'{"model": "m", "messages": [' + b",".join([b'{"role": "user", "content": "a"}'] * 3000) + b"]"
    assert (
        httpx.post(
            proxy.base_url + "/chat/completions", content=many, headers={"authorization": "Bearer k"}
        ).status_code
        == 400
    )
    not_list = b'{"model": "m", "messages": {"role": "user"}, "x": "' + b"a" * 9_000_000 + b'"}'
    response = httpx.post(
        proxy.base_url + "/chat/completions", content=not_list, headers={"authorization": "Bearer k"}
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages"
