"""What the tests of the fake Anthropic Messages API (``tests.anthropic_upstream``) driven
directly share: ``test_anthropic_fake.py``, ``test_anthropic_fake_protocol.py`` and
``test_claude_code_direct.py``. The fake's start and stop (the body of each module's ``fake``
fixture), the SDK loop's task and request shape, a client and a raw POST against a fake, the
content blocks hand-made histories are built of, the error body an SDK exception carries, and the
two wordings of the real context error.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx

from tests.anthropic_upstream import AnthropicUpstream
from tests.e2e.clients import anthropic_sdk_loop as sdk

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "clients"
TASK = "Run the scripted checks one by one with run_check, then report."
CONTEXT_ERROR = re.compile(
    r"prompt is too long: \d+ tokens > \d+ maximum"
    r"|input length and `max_tokens` exceed context limit: \d+ \+ \d+ > \d+, "
    r"decrease input length or `max_tokens` and try again"
)


def started_fakes() -> Iterator[Callable[..., AnthropicUpstream]]:
    """The body of each test module's ``fake`` fixture: start fakes with the options given, stop
    them all after the test."""
    started: list[AnthropicUpstream] = []

    def start(**options: Any) -> AnthropicUpstream:
        server = AnthropicUpstream(**options).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _client(server: AnthropicUpstream, **options: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.base_url, api_key=sdk.API_KEY, max_retries=options.pop("max_retries", 0), **options
    )


def _body(messages: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    """A request of the SDK loop's shape (its tool, thinking on) with ``messages``."""
    return {
        "model": sdk.MODEL,
        "max_tokens": 4096,
        "system": sdk.SYSTEM,
        "tools": [sdk.tool_schema()],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": messages or [{"role": "user", "content": TASK}],
        **extra,
    }


def _post(server: AnthropicUpstream, body: dict[str, Any], path: str = "/v1/messages") -> httpx.Response:
    headers = {"x-api-key": sdk.API_KEY, "anthropic-version": "2023-06-01"}
    return httpx.post(server.base_url + path, json=body, headers=headers, timeout=10)


def _use(use_id: str, step: int = 1) -> dict[str, Any]:
    return {"type": "tool_use", "id": use_id, "name": sdk.TOOL_NAME, "input": {"step": step}}


def _result(use_id: str, text: str = "ok") -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": use_id, "content": text}


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _error(error: BaseException | None) -> dict[str, Any]:
    """The error body an SDK exception carries (``{"type": "error", "error": {...}, ...}``)."""
    assert isinstance(error, anthropic.APIStatusError), error
    body = error.body
    assert isinstance(body, dict), body
    return body
