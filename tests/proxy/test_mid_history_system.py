"""Claude Code with a model name it does not know (``--model glm-4.6``: GLM, Kimi, DeepSeek, a
local model behind an Anthropic-compatible endpoint) sends its environment block as a
``role: "system"`` message at ``messages[1]``. Through the real app, with its real headers and
a small window: the request is compacted, never skipped, and the view the upstream receives
keeps that message where it was, byte for byte, with the tool-use protocol intact."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import orjson

from proxy.app import create_app
from proxy.config.settings import load_settings
from proxy.state.sqlite_store import SQLiteStore
from tests.anthropic_protocol import problems
from tests.proxy.dialects.test_system_messages import WINDOW, client_body, grown

CLIENTS = Path(__file__).resolve().parents[1] / "fixtures" / "clients"


def claude_code_headers() -> dict[str, str]:
    """The headers Claude Code sent with its turn-2 request (the key redacted, a stand-in)."""
    captured = orjson.loads((CLIENTS / "claude-code-unknown-model-headers.json").read_bytes())
    turn = next(r for r in captured["run1_requests"] if r["method"] == "POST")["headers"]
    skip = {"host", "content-length", "connection", "accept-encoding", "x-api-key"}
    return {**{k: v for k, v in turn.items() if k.lower() not in skip}, "x-api-key": "sk-ant-test"}


def stream(text: str) -> bytes:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "glm-4.6", "content": []}
    message["usage"] = {"input_tokens": 10, "output_tokens": 1}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": message}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}},
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return b"".join(b"event: " + n.encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for n, e in events)


def test_the_real_unknown_model_body_is_compacted_with_its_system_message_in_place(tmp_path: Path) -> None:
    received: list[dict[str, Any]] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/messages":  # the proxy asking a local server for its window
            return httpx.Response(404, json={"error": "not found"})
        received.append(orjson.loads(request.content))
        return httpx.Response(200, content=stream("Done."), headers={"content-type": "text/event-stream"})

    settings = load_settings(
        env={},
        overrides={
            "upstream.base_url": "http://upstream.test/v1",
            "anthropic.base_url": "http://upstream.test",
            "state_dir": str(tmp_path),
            # Small for this body: it asks for a 32k-token answer and declares ~11k of tools.
            "context_windows": {"default": WINDOW},
            "policy": "improved",
        },
    )
    app = create_app(settings, transport=httpx.MockTransport(upstream), store=SQLiteStore(tmp_path / "s.db"))
    turn2 = client_body("turn2")
    bodies = [turn2, grown(turn2, 12)]

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost"
        ) as client:
            return [
                await client.post(
                    "/v1/messages?beta=true", content=orjson.dumps(b), headers=claude_code_headers()
                )
                for b in bodies
            ]

    answers = asyncio.run(run())
    for answer in answers:
        assert answer.status_code == 200, answer.text
        assert "x-compaction-skipped" not in answer.headers, answer.headers["x-compaction-skipped"]
        assert b"Done." in answer.content
    # The real turn 2 fits: it goes as sent. The session grown from it is compacted.
    assert received[0] == turn2
    assert answers[1].headers["x-compaction-trigger"] == "threshold"
    before, after = (int(answers[1].headers[f"x-compaction-tokens-{k}"]) for k in ("before", "after"))
    assert after < before
    view = received[1]
    assert len(view["messages"]) < len(bodies[1]["messages"]) and problems(view) == [], problems(view)
    # The environment block right after the task, as Claude Code sent it.
    assert view["messages"][:2] == turn2["messages"][:2]
    assert orjson.dumps(view["messages"][1]) == orjson.dumps(turn2["messages"][1])
    assert [m for m in view["messages"] if m["role"] == "system"] == [turn2["messages"][1]]
