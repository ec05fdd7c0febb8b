"""The request log records what the policy did, including a client history that diverged
from its checkpoint (edited by the agent), without content."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import respx

from proxy.app import create_app
from proxy.config.settings import load_settings
from proxy.state.sqlite_store import SQLiteStore
from tests.recording_logger import RecordingLogger

UPSTREAM = "http://upstream.test/v1"


def history(edit: str = "") -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix it."},
    ]
    for i in range(8):
        call = {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "execute_bash", "arguments": json.dumps({"command": f"run {i}"})},
        }
        output = f"CONTENT-{i} " * 300 + (edit if i == 0 else "")
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": output},
        ]
    return messages


@respx.mock
async def test_divergence_and_mechanisms_are_logged(tmp_path: Path) -> None:
    respx.post(f"{UPSTREAM}/chat/completions").mock(
        return_value=httpx.Response(
            200, json={"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}
        )
    )
    settings = load_settings(
        env={},
        overrides={
            "upstream.base_url": UPSTREAM,
            "upstream.http_client": "httpx",
            "policy": "improved",
            "state_dir": str(tmp_path),
            "context_windows": {"default": 4096},
        },
    )
    logger = RecordingLogger()
    app = create_app(settings, logger=logger, store=SQLiteStore(tmp_path / "c.db"))
    headers = {"authorization": "Bearer sk-x", "x-session-id": "s1"}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as client:
        first = await client.post(
            "/v1/chat/completions", json={"model": "m", "messages": history()}, headers=headers
        )
        edited = await client.post(
            "/v1/chat/completions", json={"model": "m", "messages": history(" EDITED")}, headers=headers
        )
    await app.state.upstream.aclose()
    assert first.headers["x-compaction-trigger"] == "threshold"
    assert edited.status_code == 200
    records = [r for r in logger.records if r["event"] == "request"]
    assert records[0]["trigger"] == "threshold" and "summarize" in records[0]["mechanisms"]
    assert records[0]["checkpoint_dropped"] is False
    assert records[1]["checkpoint_dropped"] is True
    assert "CONTENT-" not in json.dumps(records)
