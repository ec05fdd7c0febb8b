"""Policies selected by config and by header, through the running proxy, on a recorded
trajectory: the upstream receives protocol-valid, smaller views, stable between compactions."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import httpx
import pytest

from policies.conversation import parse, role
from replay.recording.rows import iter_rows, row_messages, row_tools
from tests.fake_upstream import FakeUpstream
from tests.policies.conversations import tail_start

pytestmark = pytest.mark.e2e

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "trajectories_sample.jsonl"


def trajectory() -> tuple[list[Any], list[Any]]:
    row = next(r for r in iter_rows(FIXTURE) if r["source"] == "swe-gym-openhands")
    return row_messages(row), row_tools(row)


def requests_of(messages: list[Any]) -> list[list[Any]]:
    return [messages[:i] for i, m in enumerate(messages) if role(m) == "assistant" and i > 0]


def send(proxy: Any, history: list[Any], tools: list[Any], **headers: str) -> httpx.Response:
    body = {"model": "gpt-4o", "messages": history, "tools": tools}
    response = httpx.post(
        proxy.base_url + "/chat/completions",
        json=body,
        headers={"authorization": "Bearer sk-e2e", "x-session-id": "run-1", **headers},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response


def test_policy_by_header_and_cache_stable_views(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy({"context_windows": {"default": 8192}})
    messages, tools = trajectory()
    sent_views: list[list[Any]] = []
    points: list[bool] = []
    compacted = 0
    for history in requests_of(messages):
        response = send(proxy, history, tools, **{"x-compaction-policy": "improved"})
        points.append("x-compaction-trigger" in response.headers)
        assert response.headers["x-compaction-policy"] == "improved"
        before = int(response.headers["x-compaction-tokens-before"])
        after = int(response.headers["x-compaction-tokens-after"])
        assert after <= before and after <= 8192
        view = upstream.requests[-1].json()["messages"]
        assert parse(view).problems == ()
        assert view[0] == history[0]
        compacted += after < before
        sent_views.append(view)
    assert compacted > 0 and any(points)
    # Between compactions, each request's messages start with the previous request's, but for
    # the previous view's tail in a tight session (its newest output put behind its handle).
    between = [
        (a, b) for (a, b), point in zip(itertools.pairwise(sent_views), points[1:], strict=True) if not point
    ]
    assert between and all(b[: tail_start(a)] == a[: tail_start(a)] for a, b in between)
    assert sum(b[: len(a)] == a for a, b in between) > 0


def test_default_policy_from_config_and_n_latest_by_header(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy({"policy": "n_latest_10"})
    messages, tools = trajectory()
    history = requests_of(messages)[-1]
    response = send(proxy, history, tools)
    assert response.headers["x-compaction-policy"] == "n_latest_10"
    view = upstream.requests[-1].json()["messages"]
    last_user = max(i for i, m in enumerate(history) if m["role"] == "user")
    assert len(view) <= 2 + 10 and view[0] == history[0] and history[last_user] in view
    full = send(proxy, history, tools, **{"x-compaction-policy": "full"})
    assert full.headers["x-compaction-tokens-after"] == full.headers["x-compaction-tokens-before"]
    assert upstream.requests[-1].json()["messages"] == history
