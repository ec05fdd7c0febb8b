"""Drivers of real third-party agent clients for ``tests/e2e/test_real_clients.py``.

Each driver runs one scripted agent run (the model is ``tests.agent_upstream.AgentUpstream``,
reached through the proxy) with the client's own loop and tools, and returns a ``ClientRun``:
the final answer, the steps the client's tool really ran, and the client's own history.
Imports of the client libraries stay inside the drivers, so collecting the tests never
imports them (and litellm never looks for its cost map on the network). The drivers of
Responses API clients (openai SDK, Agents SDK, Codex CLI) are in ``responses/``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from tests.agent_upstream import STEP_MARK

API_KEY = "sk-real-clients-0000000000000000"
MODEL = "agent-model"
STEP = re.compile(rf"{STEP_MARK}-(\d+) line 1:")

# litellm fetches its model cost map from the network at import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@dataclass
class ClientRun:
    final: str
    tool_steps: list[int] = field(default_factory=list)  # step numbers the client's tool ran, in order
    history: Any = None  # the client's own record of the run, JSON-able

    def history_text(self) -> str:
        return orjson.dumps(self.history, default=str).decode()


def steps_in(output: str) -> list[int]:
    """The step numbers of scripted outputs found in ``output``."""
    return [int(n) for n in STEP.findall(output)]
