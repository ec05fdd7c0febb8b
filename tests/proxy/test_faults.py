"""Faults inside the proxy fail open: a store that cannot write or read, and a summarizer that
is down, never fail the request; the client's own request goes through and the error is counted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import orjson

from policies.pipeline import Checkpoint
from proxy.app import create_app
from proxy.config.settings import load_settings
from proxy.state.sqlite_store import SQLiteStore


class BrokenStore(SQLiteStore):
    """A store whose disk is full (writes fail) and whose reads time out."""

    async def put_outputs(self, tenant: str, outputs: Any) -> None:
        raise OSError(28, "No space left on device")

    async def save_checkpoint(self, tenant: str, session: str, checkpoint: Checkpoint) -> None:
        raise OSError(28, "No space left on device")

    async def load_checkpoint(self, tenant: str, session: str) -> Checkpoint | None:
        raise TimeoutError("database is locked")

    async def add_event(
        self, tenant: str, session: str, event: dict[str, Any], checkpoint: object = None
    ) -> None:
        raise OSError(28, "No space left on device")


def history() -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    for i in range(8):
        call = {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "run", "arguments": json.dumps({"i": i})},
        }
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"output {i} " * 400},
        ]
    return messages


async def test_a_failing_store_fails_open(tmp_path: Path) -> None:
    received: list[Any] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        received.append(orjson.loads(request.content))
        return httpx.Response(
            200, json={"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}
        )

    settings = load_settings(
        env={},
        overrides={
            "state_dir": str(tmp_path),
            "policy": "improved",
            "context_windows": {"default": 4096},
            "upstream.http_client": "httpx",
        },
    )
    app = create_app(settings, transport=httpx.MockTransport(upstream), store=BrokenStore(tmp_path / "c.db"))
    messages = history()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as client:
        response = await client.post("/v1/chat/completions", json={"model": "m", "messages": messages})
        metrics = (await client.get("/metrics")).text
    assert response.status_code == 200
    # Offloading could not be made durable: no handle was sent, the client's messages went as they were.
    assert received[-1]["messages"] == messages
    assert "read_tool_output" not in json.dumps(received[-1])
    assert 'compaction_proxy_errors_total{kind="store_write"}' in metrics
    assert 'compaction_proxy_errors_total{kind="store_read"}' in metrics
