"""Drivers of real Responses API clients for the tests of ``POST /v1/responses`` through the
proxy (``tests/e2e/test_responses_clients.py``, ``test_responses_client_failures.py``,
``test_codex_cli.py``).

Each driver runs one scripted agent run (the model is
``tests.responses_upstream.ResponsesUpstream``, reached through the proxy or directly) with the
client's own loop: ``openai_sdk`` (``client.responses.create`` / ``.stream``, a loop driven
here the way Codex drives it), ``openai_agents`` (the Agents SDK's default Responses model),
``codex_cli`` (``codex exec`` from npm). ``runs`` holds what the tests share: the runs, the
failures injected, the checks of a clean run. Imports of the client libraries stay inside the
drivers, so collecting the tests never imports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from tests.responses_upstream import READ_TOOL

MODEL = "agent-model"
API_KEY = "sk-responses-clients-000000000000"
CLIENT_TIMEOUT = 60.0
TOOL_NAME = "run_check"
TOOL_DESCRIPTION = "Run the scripted check number `step` and return its full log."
INSTRUCTIONS = "You run checks with run_check, one per turn, then report."


class StreamFailed(Exception):
    """A Responses stream that ended with an ``error`` or ``response.failed`` event, or without
    ``response.completed``."""

    def __init__(self, message: str, event: Any = None) -> None:
        super().__init__(message)
        self.event = event


@dataclass
class ClientRun:
    final: str
    tool_steps: list[int] = field(default_factory=list)  # steps the client's own tool ran, in order
    history: Any = None  # the client's own record of the run, JSON-able
    stream_problems: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)

    def history_text(self) -> str:
        return orjson.dumps(self.history, default=str).decode()


def leaks(text: str) -> list[str]:
    """Marks of the proxy's read tool in a client's own history (there must be none)."""
    return [mark for mark in (READ_TOOL, "handle=out_") if mark in text]
