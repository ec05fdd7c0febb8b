"""Security properties: keys never in logs, events or metrics; sessions of one key invisible to
another; the state directory and store owner-only; the upstream fixed by configuration."""

from __future__ import annotations

import os
import stat
from typing import Any

import httpx
import pytest

from tests.conftest import REDIS_SUITE
from tests.e2e.test_read_tool_output import history
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.e2e

KEY_A = "sk-secret-tenant-a-9f8e7d6c5b4a"
KEY_B = "sk-secret-tenant-b-1a2b3c4d5e6f"


def test_keys_never_leave_the_request(start_proxy: Any, upstream: FakeUpstream, tmp_path: Any) -> None:
    jsonl = tmp_path / "events.jsonl"
    proxy = start_proxy(
        {
            "policy": "improved",
            "context_windows": {"default": 8192},
            "events": {"jsonl_path": str(jsonl)},
            "upstream": {"api_key": "sk-configured-upstream-key-42"},
        }
    )
    for key in (KEY_A, KEY_B):
        httpx.post(
            proxy.base_url + "/chat/completions",
            json={"model": "m", "messages": history()},
            headers={"authorization": f"Bearer {key}", "x-session-id": "same-id"},
        )
    httpx.post(proxy.base_url + "/chat/completions", json={"model": "m", "messages": history()[:2]})
    places = {
        "log": proxy.log_path.read_text(),
        "metrics": httpx.get(proxy.url + "/metrics").text,
        "events file": jsonl.read_text(),
        "events api": httpx.get(
            proxy.base_url + "/compaction/events", headers={"authorization": f"Bearer {KEY_A}"}
        ).text,
    }
    for place, text in places.items():
        for secret in (KEY_A, KEY_B, "sk-configured-upstream-key-42", "tenant-a-9f8e7d"):
            assert secret not in text, f"{secret} found in the {place}"
    # The same X-Session-Id under two keys is two sessions, each visible only to its key.
    events_a = httpx.get(
        proxy.base_url + "/compaction/events",
        params={"session": "same-id"},
        headers={"authorization": f"Bearer {KEY_A}"},
    ).json()["data"]
    events_b = httpx.get(
        proxy.base_url + "/compaction/events",
        params={"session": "same-id"},
        headers={"authorization": f"Bearer {KEY_B}"},
    ).json()["data"]
    assert len(events_a) == len(events_b) == 1
    assert events_a[0]["session"] != events_b[0]["session"] and events_a[0]["tenant"] != events_b[0]["tenant"]
    # The state directory and the store file are the owner's only.
    assert stat.S_IMODE(os.stat(proxy.state_dir).st_mode) == 0o700
    if not REDIS_SUITE:
        assert stat.S_IMODE(os.stat(proxy.state_dir / "compaction.db").st_mode) == 0o600


def test_clients_cannot_choose_the_upstream(proxy: Any, upstream: FakeUpstream) -> None:
    # A Host the proxy does not answer for is a 421 (DNS rebinding), never another upstream.
    response = httpx.post(
        proxy.base_url + "/chat/completions",
        json={"model": "m", "messages": history()[:2]},
        headers={"host": "evil.example"},
    )
    assert response.status_code == 421
    for headers in (
        {"x-forwarded-host": "evil.example"},
        {"forwarded": "host=evil.example"},
    ):
        response = httpx.post(
            proxy.base_url + "/chat/completions",
            json={"model": "m", "messages": history()[:2]},
            headers=headers,
        )
        assert response.status_code == 200
    assert all(r.path == "/v1/chat/completions" for r in upstream.requests)
    for path in ("/v1/../../etc/passwd", "/v1/%2e%2e/admin", "/v1/http://evil.example/x"):
        response = httpx.get(proxy.url + path)
        assert response.status_code in (400, 200, 404)
    assert all(r.path.startswith("/v1/") for r in upstream.requests)
