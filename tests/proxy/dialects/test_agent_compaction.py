"""An agent's own compaction request is recognized by its last user message, which a session's
next body tells from what was known of the last one: only the messages added since are looked
at, with the same answer as a scan of the whole history."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import proxy.route.steps
from proxy.app import create_app
from proxy.config.settings import load_settings
from proxy.dialects.agent_compaction import agent_compaction
from proxy.route.known_bodies import KnownBodies

PROMPT = "Your task is to create a detailed summary of the conversation so far."
ROLES = st.sampled_from(["system", "user", "assistant", "tool"])
MESSAGE = st.builds(lambda role, text: {"role": role, "content": text}, ROLES, st.sampled_from(["a", PROMPT]))


def last_user_scanned(items: Sequence[Any]) -> int:
    return next((i for i in range(len(items) - 1, -1, -1) if items[i].get("role") == "user"), -1)


@settings(max_examples=300)
@given(st.lists(st.tuples(st.integers(0, 3), st.lists(MESSAGE, max_size=4)), min_size=1, max_size=6))
def test_the_last_user_message_is_known_from_the_new_messages(moves: list[tuple[int, list[Any]]]) -> None:
    """A session's bodies: each drops up to three of the last messages (an edited turn) and adds
    some. Each body's answer is a whole scan's, and from the second on it is carried forward."""
    known = KnownBodies()
    messages: list[Any] = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    for drop, added in moves:
        messages = [*messages[: max(1, len(messages) - drop)], *added]
        parsed = known.parse(b"k", orjson.dumps({"model": "m", "messages": messages}), "messages")
        assert parsed.record is not None
        assert parsed.record.last_user() == last_user_scanned(messages)
        hint = parsed.record.last_user()
        assert agent_compaction([], messages, hint) == agent_compaction([], messages)


def test_a_step_with_no_user_message_looks_at_the_new_messages_only() -> None:
    known = KnownBodies()
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    first = known.parse(b"k", orjson.dumps({"messages": messages}), "messages").record
    assert first is not None and first.last_user() == 1
    messages += [{"role": "assistant", "content": "x"}, {"role": "tool", "content": "y"}]
    second = known.parse(b"k", orjson.dumps({"messages": messages}), "messages").record
    assert second is not None and (second.reused, second.earlier_user) == (2, 1)
    assert second.last_user() == 1


@pytest.mark.parametrize(
    ("messages", "hint", "agent"),
    [
        ([{"role": "user", "content": "task"}, {"role": "user", "content": PROMPT}], 1, "claude-code"),
        ([{"role": "user", "content": PROMPT}, {"role": "tool", "content": "x"}], 0, "claude-code"),
        ([{"role": "user", "content": PROMPT}, {"role": "user", "content": "go on"}], 1, None),
        ([{"role": "assistant", "content": PROMPT}], -1, None),
    ],
)
def test_a_known_last_user_message_decides_as_the_scan_does(
    messages: list[Any], hint: int, agent: str | None
) -> None:
    assert agent_compaction([], messages, hint) == agent_compaction([], messages) == agent


async def test_the_chat_door_recognizes_a_compaction_request_from_what_it_knew(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through the app: a session's steps, then Claude Code's compaction prompt as its last user
    message, then a step after it and a new instruction. The route passes what the body reader
    knew of the last user message (not scanning the history), and decides as before."""
    hints: list[int | None] = []
    decide = proxy.route.steps.agent_compaction

    def spied(headers: Any, messages: Any, last_user: int | None = None) -> str | None:
        hints.append(last_user)
        return decide(headers, messages, last_user)

    monkeypatch.setattr(proxy.route.steps, "agent_compaction", spied)
    answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}
    upstream = httpx.MockTransport(lambda request: httpx.Response(200, json=answer))
    messages: list[Any] = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    skipped = []
    with tempfile.TemporaryDirectory() as state:
        settings_ = load_settings(
            env={}, overrides={"state_dir": state, "policy": "improved", "upstream.http_client": "httpx"}
        )
        app = create_app(settings_, transport=upstream)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost"
        ) as client:
            for added in (
                [{"role": "assistant", "content": "step"}, {"role": "user", "content": "more"}],
                [{"role": "assistant", "content": "step"}],
                [{"role": "user", "content": PROMPT}],
                [{"role": "assistant", "content": "summary"}],
                [{"role": "user", "content": "go on"}],
            ):
                messages = [*messages, *added]
                response = await client.post(
                    "/v1/chat/completions",
                    json={"model": "gpt-4o", "messages": messages},
                    headers={"authorization": "Bearer sk-test", "x-session-id": "s1"},
                )
                assert response.status_code == 200
                skipped.append(response.headers.get("x-compaction-skipped"))
    own = "claude-code's own compaction request"
    assert skipped == [None, None, own, own, None]
    assert hints[0] is None and all(hint is not None for hint in hints[1:])
