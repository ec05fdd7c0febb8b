"""The client's own ``X-Session-Id`` kept with its session's events, shown as a bounded label,
and seen only by its own tenant."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import respx

from proxy.app import create_app
from proxy.config.settings import load_settings
from proxy.state.sessions import CLIENT_SESSION_CHARS, client_session_label, client_session_of
from proxy.state.sqlite_store import SQLiteStore
from tests.proxy.state.test_session_records import UPSTREAM, history


def test_the_label_is_bounded_and_has_no_control_characters() -> None:
    assert client_session_label(b"first-hour") == "first-hour"
    assert client_session_label(b"a\nb\x1b[31m\xff") == "a?b?[31m\ufffd"
    assert client_session_label("\u202eevil") == "?evil"  # a bidi override would reorder the page
    long = client_session_label("x" * 10_000)
    assert len(long) == CLIENT_SESSION_CHARS and long.endswith("\u2026")
    assert client_session_of([(b"x-session-id", b"run-1")]) == "run-1"
    assert client_session_of([(b"authorization", b"Bearer k")]) is None


@respx.mock
async def test_events_and_sessions_carry_it_for_their_tenant_only(tmp_path: Path) -> None:
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
            "state_dir": str(tmp_path),
            "context_windows": {"default": 4096},
        },
    )
    app = create_app(settings, store=SQLiteStore(tmp_path / "c.db"))
    mine = {"authorization": "Bearer sk-mine"}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as client:
        sent = await client.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": history()},
            headers={**mine, "x-session-id": "my-run"},
        )
        assert sent.headers["x-compaction-trigger"] == "threshold"
        # Without the header the session is found from the conversation: no client id.
        await client.post(
            "/v1/chat/completions", json={"model": "m", "messages": history(" OTHER")}, headers=mine
        )
        for _ in range(100):  # the event is written in the background
            rows = (await client.get("/v1/compaction/sessions", headers=mine)).json()["data"]
            if len(rows) == 2:
                break
            await asyncio.sleep(0.02)
        events = (await client.get("/v1/compaction/events?session=my-run", headers=mine)).json()["data"]
        theirs = await client.get("/v1/compaction/sessions", headers={"authorization": "Bearer sk-theirs"})
    await app.state.upstream.aclose()
    assert sorted(str(row["client_session"]) for row in rows) == ["None", "my-run"]
    assert [e["client_session"] for e in events] == ["my-run"]
    assert theirs.json()["data"] == []
