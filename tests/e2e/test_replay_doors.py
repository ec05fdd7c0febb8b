"""Replay through every door: the sample trajectories written as Chat Completions requests, as
Responses API requests, as Anthropic Messages requests, as Gemini API requests (the model in the
path) and as Gemini CLI's Code Assist requests, replayed through the real proxy with
``improved`` at a 16k window, make the same compaction decisions (trigger, covered range,
handles, summary) and the same survival per case and question; the scripted reader reads saved
outputs back through each door."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from replay.config import load_replay_config
from replay.run.run import RunOptions, run_replay

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent.parent
SAMPLE = ROOT / "tests" / "fixtures" / "sample_trajectories.jsonl"  # the 68 sample rows
FIXTURE = ROOT / "tests" / "fixtures" / "trajectories_sample.jsonl"


# Time-blind: `improved` rewrites a warm prefix where it pays at the provider's prices (the
# proxy is told the run's: Anthropic's or Gemini's make fewer rewrites pay than gpt-4o's, by
# design), and whether one pays is decided on token counts, which differ by a few tokens
# between wire formats. The decisions that do not depend on prices are compared here.
TIME_BLIND = {"timed": False}


def replay(door: str, tmp_path: Path) -> dict[str, Any]:
    config = load_replay_config(
        None,
        {
            "arms": ("improved",),
            "context_window": 16_000,
            "dialect": door,
            "concurrency": 4,
            "cache": TIME_BLIND,
        },
    )
    source = SAMPLE if SAMPLE.exists() else FIXTURE
    options = RunOptions(input=source, out=tmp_path / door, config=config, progress=False)
    result: dict[str, Any] = asyncio.run(run_replay(options))
    return result


def decisions(part: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in d.items() if k != "tokens_after"} for d in part["decisions"]]


def cut_a_step_apart(door: list[dict[str, Any]], chat: list[dict[str, Any]]) -> bool:
    """The first decision the doors differ on is the same point with its cut a step apart."""
    index = next(i for i, (d, c) in enumerate(zip(door, chat, strict=True)) if d != c)
    d, c = door[index], chat[index]
    same_point = d["trigger"] == c["trigger"] and d["covered"][0] == c["covered"][0]
    return same_point and abs(d["covered"][1] - c["covered"][1]) <= 4


@pytest.fixture(scope="module")
def chat(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    parts = replay("chat", tmp_path_factory.mktemp("chat"))["parts"]
    return {case: p.to_json() for (_, case), p in parts.items()}


@pytest.mark.parametrize("door", ["responses", "anthropic", "gemini", "code_assist"])
def test_every_door_makes_the_same_decisions_and_keeps_the_same_evidence(
    door: str, chat: dict[str, Any], tmp_path: Path
) -> None:
    result = replay(door, tmp_path)
    assert result["unexpected_upstream_requests"] == 0
    other = {case: p.to_json() for (_, case), p in result["parts"].items()}
    assert chat.keys() == other.keys() and len(chat) >= 5
    compactions = 0
    boundary: list[str] = []
    for case, through_chat in chat.items():
        through_door = other[case]
        assert through_chat["errors"] == through_door["errors"] == [], case
        assert through_chat["problems"] == through_door["problems"] == [], case
        # The same decisions. Token figures may differ a little: a tool result's name (which
        # chat clients may send and neither other API has a field for; the doors name results
        # after their calls), the read tool's declaration in each format, and tool-call
        # arguments, which Messages carries as objects (the proxy writes them compactly).
        # At a tight window a session compacts when it reaches the read ceiling, step by small
        # step (outputs behind handles between points): a door whose count is a few tokens
        # lower can reach it one request later. So the decisions both doors made are the same,
        # and one door may make one more, last; survival is compared where all are the same.
        # Likewise a point's cut (the retained tail, 0.2 x window) can land one step apart.
        door_decisions, chat_decisions = decisions(through_door), decisions(through_chat)
        shared = min(len(door_decisions), len(chat_decisions))
        if door_decisions[:shared] != chat_decisions[:shared]:
            assert cut_a_step_apart(door_decisions[:shared], chat_decisions[:shared]), case
            boundary.append(case)
            continue
        assert abs(len(door_decisions) - len(chat_decisions)) <= 1, case
        if len(door_decisions) != len(chat_decisions):
            boundary.append(case)
            continue
        for chat_tokens, door_tokens in zip(
            through_chat["tokens_before"], through_door["tokens_before"], strict=True
        ):
            assert abs(chat_tokens - door_tokens) <= max(8, chat_tokens // 100), case
        # What the view holds and what the store keeps are the doors' shared decisions; what a read
        # gets back depends on each wire format's size of a read round, so it is not compared.
        outcomes = [
            (q["question_id"], q["survival"] == "visible", q.get("stored")) for q in through_chat["questions"]
        ]
        assert [
            (q["question_id"], q["survival"] == "visible", q.get("stored")) for q in through_door["questions"]
        ] == outcomes, case
        compactions += len(through_chat["decisions"])
    assert compactions > 0
    assert len(boundary) <= max(1, len(chat) // 20), boundary
    # read_tool_output works through the door: evidence out of the view is read back through it.
    read_back = [q for p in other.values() for q in p["questions"] if q["survival"] == "recoverable"]
    assert read_back and all(q["read_calls"] > 0 for q in read_back)
