"""Room to read, through every door, at small windows, with real agents' tool schemas: the
sample trajectories replayed through the running proxy with ``improved``; at each question the
recorded upstream plays a reader that reads saved outputs back with ``read_tool_output``. Every
read returns content (none is answered "no room"), and whatever a view hides is read back.

Tool schemas: the trajectories' own (OpenHands'), Codex CLI's (its real request body, in
``tests/fixtures/clients``) at 8k, 16k and 32k, and Claude Code's (about 20k tokens of tools) at
32k, the smallest window it leaves room in."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from replay.config import load_replay_config
from replay.run.run import RunOptions, run_replay

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent.parent
# Rows whose evidence at small windows lives in saved outputs only (so reads must happen).
FIXTURE = ROOT / "tests" / "fixtures" / "read_back_sample.jsonl"
CLIENTS = ROOT / "tests" / "fixtures" / "clients"


def codex_tools() -> list[dict[str, Any]]:
    body = orjson.loads((CLIENTS / "codex-turn1.json").read_bytes())
    body = body.get("body", body)
    return [
        {"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if k in t}}
        for t in body["tools"]
        if t.get("type") == "function" and "parameters" in t
    ]


def claude_code_tools() -> list[dict[str, Any]]:
    body = orjson.loads((CLIENTS / "claude-code-turn1.json").read_bytes())
    body = body.get("body", body)
    return [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t.get("description", ""),
                "parameters": t["input_schema"],
            },
        }
        for t in body["tools"]
        if "input_schema" in t
    ]


def with_tools(tmp_path: Path, tools: list[dict[str, Any]] | None) -> Path:
    if tools is None:
        return FIXTURE
    rows = [orjson.loads(line) for line in FIXTURE.read_bytes().splitlines() if line.strip()]
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps({**row, "tools": tools}) for row in rows) + b"\n")
    return path


def questions(door: str, window: int, source: Path, out: Path) -> list[dict[str, Any]]:
    config = load_replay_config(
        None, {"arms": ("improved",), "context_window": window, "dialect": door, "concurrency": 4}
    )
    result = asyncio.run(run_replay(RunOptions(input=source, out=out, config=config, progress=False)))
    parts = list(result["parts"].values())
    assert parts and all(not p.errors and not p.problems for p in parts)
    return [q for p in parts for q in p.to_json()["questions"]]


CASES = [
    (door, window, schema)
    for door in ("chat", "responses", "anthropic")
    for window, schema in ((8_000, "openhands"), (16_000, "codex"), (32_000, "claude_code"))
] + [("chat", 8_000, "codex"), ("chat", 32_000, "openhands")]


@pytest.mark.parametrize(("door", "window", "schema"), CASES)
def test_every_read_returns_content_and_hidden_evidence_is_read_back(
    door: str, window: int, schema: str, tmp_path: Path
) -> None:
    tools = {"openhands": None, "codex": codex_tools(), "claude_code": claude_code_tools()}[schema]
    asked = questions(door, window, with_tools(tmp_path, tools), tmp_path / "run")
    assert asked
    read = [q for q in asked if q.get("read_calls")]
    assert all(q["no_room_reads"] == 0 for q in asked), [
        q["question_id"] for q in asked if q["no_room_reads"]
    ]
    lost = [(q["question_id"], q["missing"]) for q in asked if q["survival"] == "lost"]
    assert lost == [], lost
    if window == 8_000:
        assert read, "at 8k some evidence is only in saved outputs: the reader must have read"
