"""A GPT-5 agent with custom tools (``apply_patch`` as a free-form grammar tool) through the real
app's Chat Completions door at a small window: its session is compacted (never
``x-compaction-skipped``), and the upstream receives valid custom calls, each answered, the
custom tools as declared and ``read_tool_output`` beside them as a function tool."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import orjson

from policies.conversation import shape_problem
from policies.handles import ARGUMENT_PREFIX
from proxy.app import create_app
from proxy.config.settings import load_settings
from proxy.read_tool.tool import TOOL_NAME
from proxy.state.sqlite_store import SQLiteStore
from tests.proxy.dialects.test_chat_custom import TOOLS, customs, protocol_problems, session


def test_a_custom_tool_session_is_compacted_with_its_calls_custom(tmp_path: Path) -> None:
    received: list[dict[str, Any]] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        body = orjson.loads(request.content) if request.content else {}
        if "messages" in body:  # not the proxy asking a local server for its window
            received.append(body)
        message = {"role": "assistant", "content": "Done."}
        return httpx.Response(
            200, json={"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
        )

    settings = load_settings(
        env={},
        overrides={
            "upstream.base_url": "http://upstream.test/v1",
            "state_dir": str(tmp_path),
            "context_windows": {"default": 16_000},
            "policy": "improved",
        },
    )
    app = create_app(settings, transport=httpx.MockTransport(upstream), store=SQLiteStore(tmp_path / "s.db"))
    bodies = [session(4), session(24), session(27)]

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost"
        ) as client:
            headers = {"authorization": "Bearer sk-test", "x-session-id": "gpt5-custom"}
            return [await client.post("/v1/chat/completions", json=b, headers=headers) for b in bodies]

    answers = asyncio.run(run())
    for answer in answers:
        assert answer.status_code == 200, answer.text
        assert "x-compaction-skipped" not in answer.headers, answer.headers["x-compaction-skipped"]
    assert received[0] == bodies[0]  # small: as sent
    compacted = answers[1]
    assert compacted.headers["x-compaction-trigger"] == "threshold"
    before, after = (int(compacted.headers[f"x-compaction-tokens-{k}"]) for k in ("before", "after"))
    assert after < before / 4
    for body, view in zip(bodies[1:], received[1:], strict=True):
        messages = view["messages"]
        assert len(orjson.dumps(view)) < len(orjson.dumps(body))
        assert shape_problem(messages) is None and protocol_problems(messages) == []
        sent, originals = customs(messages), customs(body["messages"])
        assert sent and all(
            call["custom"]["name"] == originals[i]["custom"]["name"] for i, call in sent.items()
        )
        assert any(c["custom"]["input"].startswith(ARGUMENT_PREFIX) for c in sent.values())
        # The client's custom tools as declared; the read tool beside them, a function tool.
        assert view["tools"][: len(TOOLS)] == TOOLS
        assert [t["type"] for t in view["tools"][len(TOOLS) :]] == ["function"]
        assert view["tools"][-1]["function"]["name"] == TOOL_NAME
        # The newest step as the client sent it.
        assert messages[-2:] == body["messages"][-2:]
