"""Compaction events through the running proxy: schema and content, tenant scoping and the
admin token, the JSON-lines file, the CLI, and rebuilding the exact view from an event."""

from __future__ import annotations

import base64
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import httpx
import msgspec
import orjson
import pytest

from policies.digests import Digests
from policies.pipeline import Checkpoint, View, apply_checkpoint
from tests.conftest import ROOT
from tests.e2e.test_read_tool_output import history
from tests.fake_upstream import FakeUpstream, Reply, chunk, completion

pytestmark = pytest.mark.e2e

CONFIG: dict[str, Any] = {"policy": "improved", "context_windows": {"default": 8192}}


def chat(
    proxy: Any, messages: list[Any], key: str = "sk-events-a", session: str = "run-1", **headers: str
) -> httpx.Response:
    return httpx.post(
        proxy.base_url + "/chat/completions",
        json={"model": "gpt-4o", "messages": messages},
        headers={"authorization": f"Bearer {key}", "x-session-id": session, **headers},
        timeout=30,
    )


def file_lines(path: Path, seconds: float = 5.0) -> list[str]:
    """The lines of an events file once it has one: the sink appends after the store write."""
    deadline = time.monotonic() + seconds
    while not (path.exists() and path.read_bytes().endswith(b"\n")) and time.monotonic() < deadline:
        time.sleep(0.02)
    return path.read_text().splitlines()


def test_events_describe_and_reproduce_the_view(
    start_proxy: Any, upstream: FakeUpstream, tmp_path: Path
) -> None:
    jsonl = tmp_path / "events.jsonl"
    proxy = start_proxy({**CONFIG, "events": {"jsonl_path": str(jsonl)}})
    messages = history()
    response = chat(proxy, messages)
    assert response.headers["x-compaction-trigger"] == "threshold"
    sent = upstream.requests[-1].json()["messages"]
    listed = httpx.get(
        proxy.base_url + "/compaction/events",
        params={"session": "run-1"},
        headers={"authorization": "Bearer sk-events-a"},
    ).json()["data"]
    assert len(listed) == 1
    event = listed[0]
    assert event["schema_version"] == 1 and event["event_id"].startswith("ev_")
    assert event["request_id"] == response.headers["x-compaction-request-id"]
    assert event["policy"] == "improved" and event["mode"] == "enforce" and event["model"] == "gpt-4o"
    assert len(event["policy_config_hash"]) == 16 and event["policy_version"]
    assert (
        event["trigger"] == "threshold" and event["window"] == 8192 and event["threshold"] == int(0.75 * 8192)
    )
    assert "offload" in event["mechanisms"]
    assert event["tokens_before"] == int(response.headers["x-compaction-tokens-before"])
    assert event["tokens_after"] == int(response.headers["x-compaction-tokens-after"])
    assert event["messages_before"] == len(messages) and event["messages_after"] == len(sent)
    assert event["handles_offloaded"] and event["offloaded_bytes"] > 0
    assert event["tenant"].startswith("t_") and "sk-events-a" not in orjson.dumps(event).decode()
    # The event's checkpoint and the client's history rebuild the exact view that was sent.
    checkpoint = msgspec.convert(event["checkpoint"], Checkpoint)
    view = View(
        messages=list(messages), original=messages, origin=list(range(len(messages))), checkpoint=checkpoint
    )
    apply_checkpoint(view, Digests())
    assert view.messages == sent
    # At a compaction point the event holds the view itself too.
    assert orjson.loads(zlib.decompress(base64.b64decode(event["view"]))) == sent
    # Appended to the JSON-lines file too (after the store: the read above may come first).
    assert [orjson.loads(line)["event_id"] for line in file_lines(jsonl)] == [event["event_id"]]
    # Another tenant sees none of it.
    other = httpx.get(proxy.base_url + "/compaction/events", headers={"authorization": "Bearer sk-events-b"})
    assert other.json()["data"] == []
    # The CLI reads the same store.
    printed = subprocess.run(
        [
            sys.executable,
            "-m",
            "proxy.cli",
            "events",
            "--config",
            str(proxy.config_path),
            "--policy",
            "improved",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.splitlines()
    assert [orjson.loads(line)["event_id"] for line in printed] == [event["event_id"]]


def test_admin_token_guards_the_events_route(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy({**CONFIG, "server": {"admin_token": "admin-secret-123"}})
    chat(proxy, history(), key="sk-events-a")
    chat(proxy, history("BRAVO"), key="sk-events-b")
    route = proxy.base_url + "/compaction/events"
    assert httpx.get(route).status_code == 401
    assert httpx.get(route, headers={"authorization": "Bearer sk-events-a"}).status_code == 401
    everything = httpx.get(route, headers={"authorization": "Bearer admin-secret-123"}).json()["data"]
    assert len({e["tenant"] for e in everything}) == 2
    one = httpx.get(
        route,
        params={"tenant": everything[0]["tenant"]},
        headers={"authorization": "Bearer admin-secret-123"},
    ).json()["data"]
    assert {e["tenant"] for e in one} == {everything[0]["tenant"]}


def test_compaction_metrics_after_scripted_traffic(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy(CONFIG)
    chat(proxy, history())
    chat(proxy, history("BRAVO"), session="run-2", **{"x-compaction-policy": "improved_step"})
    metrics = httpx.get(proxy.url + "/metrics").text
    expected = [
        'compaction_proxy_compactions_total{mechanism="offload",policy="improved",trigger="threshold"} 1.0',
        'compaction_proxy_compactions_total{mechanism="summarize",policy="improved_step",'
        'trigger="threshold"} 1.0',
        # Five outputs and the transcript of the summary that brings the whole request (the
        # answer's reserve included) down to the target.
        'compaction_proxy_outputs_offloaded_total{policy="improved"} 6.0',
        'compaction_proxy_summarizer_calls_total{outcome="ledger"} 2.0',
    ]
    for line in expected:
        assert line in metrics


def test_shadow_mode_sends_the_original_and_records_the_view(
    start_proxy: Any, upstream: FakeUpstream
) -> None:
    proxy = start_proxy({**CONFIG, "mode": "shadow"})
    messages = history()
    body = orjson.dumps({"model": "gpt-4o", "messages": messages})
    response = httpx.post(
        proxy.base_url + "/chat/completions",
        content=body,
        headers={
            "authorization": "Bearer sk-events-a",
            "x-session-id": "run-s",
            "content-type": "application/json",
        },
        timeout=30,
    )
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == "ok"
    assert upstream.requests[-1].body == body  # the upstream saw the client's bytes
    assert response.headers["x-compaction-mode"] == "shadow"
    assert int(response.headers["x-compaction-tokens-after"]) < int(
        response.headers["x-compaction-tokens-before"]
    )
    events = httpx.get(
        proxy.base_url + "/compaction/events", headers={"authorization": "Bearer sk-events-a"}
    ).json()["data"]
    assert [e["mode"] for e in events] == ["shadow"]
    metrics = httpx.get(proxy.url + "/metrics").text
    assert (
        'compaction_proxy_requests_total{mode="shadow",policy="improved",route="chat",status_class="2xx"} 1.0'
        in metrics
    )


def test_metrics_are_correct_with_several_workers(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy({"server": {"workers": 2}, "context_windows": {"default": 8192}, "policy": "full"})
    sent = 0

    def served_by() -> set[Any]:
        return {orjson.loads(line)["pid"] for line in proxy.log_lines() if '"event":"request"' in line}

    # New connections, until both workers have served some (bounded).
    while sent < 60 and (sent < 10 or len(served_by()) < 2):
        httpx.post(
            proxy.base_url + "/chat/completions",
            json={"model": "m", "messages": history()[:2]},
            headers={"connection": "close"},
        )
        sent += 1
    assert len(served_by()) == 2
    chat(
        proxy, history(), session="workers-run", **{"x-compaction-policy": "improved", "connection": "close"}
    )
    for _ in range(4):  # whichever worker answers, it reports every worker's values
        metrics = httpx.get(proxy.url + "/metrics", headers={"connection": "close"}).text
        series = (
            'compaction_proxy_requests_total{mode="enforce",policy="full",route="chat",status_class="2xx"}'
        )
        assert f"{series} {sent}.0" in metrics
        assert 'compaction_proxy_outputs_offloaded_total{policy="improved"} 6.0' in metrics


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "c",
        "type": "function",
        "function": {"name": name, "arguments": orjson.dumps(arguments).decode()},
    }


def _events_with_compare(proxy: Any, count: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        events = httpx.get(
            proxy.base_url + "/compaction/events", headers={"authorization": "Bearer sk-events-a"}
        ).json()["data"]
        if len([e for e in events if e.get("shadow_compare")]) >= count:
            return events
        time.sleep(0.1)
    raise AssertionError("no shadow comparison recorded")


def test_shadow_compare_records_decision_divergence(start_proxy: Any, upstream: FakeUpstream) -> None:
    config = {**CONFIG, "mode": "shadow", "shadow": {"compare": True, "sample_rate": 1.0}}
    proxy = start_proxy(config)
    real = _call("execute_bash", {"command": "pytest  -q"})
    upstream.queue(
        Reply(body=completion(tool_calls=[real])),  # the real answer, returned to the client
        Reply(
            body=completion(tool_calls=[_call("str_replace_editor", {"command": "view", "path": "/x.py"})])
        ),
    )
    answer = chat(proxy, history(), session="cmp-1").json()
    assert answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "execute_bash"
    upstream.wait_for_requests(2)
    original, compacted = upstream.requests
    assert (
        len(compacted.json()["messages"]) < len(original.json()["messages"])
        or compacted.body != original.body
    )
    assert "stream" not in compacted.json()
    # The same next decision, from a streamed real answer.
    upstream.queue(
        Reply(
            kind="sse",
            chunks=[
                chunk("", role=True),
                {
                    **chunk(None),
                    "choices": [
                        {
                            "index": 0,
                            "delta": {
                                "tool_calls": [
                                    {
                                        "index": 0,
                                        "id": "c",
                                        "type": "function",
                                        "function": {
                                            "name": "execute_bash",
                                            "arguments": '{"command": "pytest -q"}',
                                        },
                                    }
                                ]
                            },
                            "finish_reason": None,
                        }
                    ],
                },
                chunk(None, finish="tool_calls"),
            ],
        ),
        Reply(body=completion(tool_calls=[real])),
    )
    httpx.post(
        proxy.base_url + "/chat/completions",
        json={"model": "gpt-4o", "messages": history("BRAVO"), "stream": True},
        headers={"authorization": "Bearer sk-events-a", "x-session-id": "cmp-2"},
    )
    events = _events_with_compare(proxy, 2)
    compares = {e["session"].split(":")[0]: e["shadow_compare"] for e in events if e.get("shadow_compare")}
    assert sorted((c["real"], c["shadow"], c["diverged"]) for c in compares.values()) == [
        ("execute_bash: pytest -q", "execute_bash: pytest -q", False),
        ("execute_bash: pytest -q", "str_replace_editor: /x.py", True),
    ]
    metrics = httpx.get(proxy.url + "/metrics").text
    assert 'compaction_proxy_shadow_compares_total{policy="improved",result="diverged"} 1.0' in metrics
    assert 'compaction_proxy_shadow_compares_total{policy="improved",result="same"} 1.0' in metrics
