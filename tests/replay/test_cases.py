"""Case building by the rules of section 4.3."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from policies.conversation import parse
from replay.recording.cases import Case, Rejected, build_case, build_cases
from replay.recording.rows import iter_rows

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "tests" / "fixtures" / "sample_trajectories.jsonl"  # the 68 sample rows
FIXTURE = ROOT / "tests" / "fixtures" / "trajectories_sample.jsonl"
PAD = {"content": None, "name": None, "role": None, "tool_call_id": None, "tool_calls": None}


def padded(message: dict[str, Any]) -> dict[str, Any]:
    return {**PAD, **message}


def call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    raw = arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": raw}}


def row(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "instance_id": "owner__repo-1",
        "repo": "owner/repo",
        "source": "test",
        "trajectory_id": "t1",
        "resolved": True,
        "model_patch": None,
        "tools": [],
        "trajectory": [padded(m) for m in messages],
        **extra,
    }


START = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "Fix the bug."},
    {"role": "assistant", "content": "", "tool_calls": [call("c1", "execute_bash", {"command": "ls"})]},
    {"role": "tool", "tool_call_id": "c1", "name": "execute_bash", "content": "a.py"},
]


def built(messages: list[dict[str, Any]], **extra: Any) -> Case:
    case = build_case(row(messages, **extra), 7)
    assert isinstance(case, Case), case
    return case


def test_padding_removed_and_steps_are_assistant_messages() -> None:
    case = built([*START, {"role": "assistant", "content": "Done."}])
    assert all(None not in m.values() for m in case.messages)
    assert case.steps == (2, 4)
    assert case.row_number == 7
    assert case.system_prompt == "You are an agent."
    assert [(a.tool, a.args, a.command) for a in case.actions(2)] == [
        ("execute_bash", {"command": "ls"}, "ls")
    ]


def test_final_unanswered_finish_call_is_dropped() -> None:
    case = built([*START, {"role": "assistant", "content": "", "tool_calls": [call("f", "finish", {})]}])
    assert len(case.messages) == 4
    assert case.dropped == ("final finish call",)


def test_final_finish_keeps_its_text() -> None:
    finish = {"role": "assistant", "content": "All fixed.", "tool_calls": [call("f", "finish", {})]}
    case = built([*START, finish])
    assert case.messages[-1] == {"role": "assistant", "content": "All fixed."}


def test_trailing_call_with_missing_results_goes_with_its_other_results() -> None:
    two_calls = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            call("c2", "execute_bash", {"command": "a"}),
            call("c3", "execute_bash", {"command": "b"}),
        ],
    }
    case = built(
        [*START, two_calls, {"role": "tool", "tool_call_id": "c2", "name": "execute_bash", "content": "x"}]
    )
    assert len(case.messages) == 4
    assert case.dropped[0].startswith("trailing call without results")
    assert not parse(list(case.messages)).problems


def test_unmatched_call_in_the_middle_is_rejected() -> None:
    broken = [
        *START[:2],
        {"role": "assistant", "content": "", "tool_calls": [call("c1", "execute_bash", {"command": "ls"})]},
        {"role": "user", "content": "and?"},
        {"role": "assistant", "content": "ok"},
    ]
    result = build_case(row(broken), 0)
    assert isinstance(result, Rejected)
    assert result.reason == "unmatched tool call"


def test_orphan_result_is_rejected() -> None:
    broken = [
        *START,
        {"role": "tool", "tool_call_id": "zz", "content": "?"},
        {"role": "assistant", "content": "ok"},
    ]
    result = build_case(row(broken), 0)
    assert isinstance(result, Rejected) and result.reason == "unmatched tool result"


def test_arguments_that_are_not_a_json_object_are_rejected() -> None:
    bad = [*START[:2], {"role": "assistant", "content": "", "tool_calls": [call("c1", "x", "not json")]}]
    result = build_case(row([*bad, {"role": "tool", "tool_call_id": "c1", "content": "?"}]), 0)
    assert isinstance(result, Rejected) and result.reason == "tool arguments not a JSON object"


def test_no_user_message_is_rejected() -> None:
    result = build_case(row([{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]), 0)
    assert isinstance(result, Rejected) and result.reason == "no user message"


def test_text_actions_final_submit_is_dropped() -> None:
    messages = [
        {"role": "system", "content": "SETTING"},
        {"role": "user", "content": "ISSUE: fix it"},
        {"role": "assistant", "content": "Look.\n```\nls\n```"},
        {"role": "user", "content": "a.py\n(Open file: n/a)\nbash-$"},
        {"role": "assistant", "content": "Run it.\n```\npython a.py\n```"},
        {"role": "user", "content": "ok\nbash-$"},
        {"role": "assistant", "content": "Done.\n```\nsubmit\n```"},
    ]
    case = built(messages)
    assert case.text_actions
    assert case.dropped == ("final submit action",)
    assert case.steps == (2, 4)


def test_tool_schemas_lose_their_padding() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "execute_bash",
                "description": "run",
                "parameters": {
                    "type": "object",
                    "properties": {"command": {"type": "string"}, "path": None},
                    "required": ["command"],
                },
            },
        }
    ]
    case = built([*START, {"role": "assistant", "content": "ok"}], tools=tools)
    assert case.tools[0]["function"]["parameters"]["properties"] == {"command": {"type": "string"}}


def test_case_ids_are_unique_and_stable() -> None:
    source = SAMPLE if SAMPLE.exists() else FIXTURE
    first = [c.case_id for c in build_cases(iter_rows(source)) if isinstance(c, Case)]
    again = [c.case_id for c in build_cases(iter_rows(source)) if isinstance(c, Case)]
    assert first == again
    assert len(set(first)) == len(first)


@pytest.mark.parametrize("source", [p for p in (SAMPLE, FIXTURE) if p.exists()], ids=lambda p: p.name)
def test_every_sample_row_builds_a_protocol_clean_case(source: Path) -> None:
    for result in build_cases(iter_rows(source)):
        assert isinstance(result, Case), result
        assert not parse(list(result.messages)).problems
        assert result.steps
        # Every step is answered by a recorded assistant message.
        assert all(result.messages[i]["role"] == "assistant" for i in result.steps)
