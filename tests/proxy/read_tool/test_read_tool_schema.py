"""The read tool a dialect offers is one object per setting, so a conversation's requests
count its schema once instead of encoding and remembering a fresh copy every round."""

from __future__ import annotations

from typing import Any

import pytest

from policies.tokens import TokenCounter
from proxy.dialects import make_dialects

BODIES: dict[str, dict[str, Any]] = {
    "chat": {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
    "responses": {"model": "gpt-4o", "input": [{"role": "user", "content": "hi"}]},
    "anthropic": {
        "model": "claude-sonnet-4-5",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}],
    },
}


@pytest.mark.parametrize("name", sorted(BODIES))
def test_every_request_gets_the_same_read_tool_object(name: str) -> None:
    dialect = make_dialects()[name]
    first = dialect.with_read_tool(dict(BODIES[name]), 400)["tools"][-1]
    second = dialect.with_read_tool({**BODIES[name], "tools": [{"name": "x"}]}, 400)["tools"][-1]
    assert first is second
    assert dialect.with_read_tool(dict(BODIES[name]), 50)["tools"][-1] is not first  # its own setting


def test_counting_rounds_remembers_one_schema_object() -> None:
    dialect = make_dialects()["chat"]
    counter = TokenCounter()
    counts = [dialect.count(dialect.with_read_tool(dict(BODIES["chat"]), 400), counter) for _ in range(5)]
    assert len(set(counts)) == 1
    assert len(counter._tool_counts._young) == 1
