"""Small hand-written agent runs for the question tests (``test_questions*.py``): native
tool-call runs, SWE-agent text-action runs, and checks shared by every kind."""

from __future__ import annotations

import json
from typing import Any

from replay.questions import build_questions, history_texts
from replay.recording.cases import Case, build_case

TASK = "<uploaded_files>\n/workspace/proj\n</uploaded_files>\nFix the bug in pkg/mod.py."


def msg(role: str, content: Any = None, **extra: Any) -> dict[str, Any]:
    message = {"role": role, "content": content, "name": None, "tool_call_id": None, "tool_calls": None}
    message.update(extra)
    return message


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def assistant(*calls: dict[str, Any], text: str = "") -> dict[str, Any]:
    return msg("assistant", text, tool_calls=list(calls) or None)


def result(call_id: str, name: str, content: str) -> dict[str, Any]:
    return msg("tool", content, name=name, tool_call_id=call_id)


def make_case(messages: list[dict[str, Any]], patch: str | None = None) -> Case:
    row = {
        "instance_id": "owner__proj-1",
        "repo": "owner/proj",
        "source": "test",
        "trajectory": [msg("system", "You are an agent."), *messages],
        "model_patch": patch,
        "tools": [],
    }
    case = build_case(row, 0)
    assert isinstance(case, Case), case
    return case


def native_run(*steps: tuple[dict[str, Any], str], task: str = TASK, patch: str | None = None) -> Case:
    """A native tool-call run: each step is (call, its result text)."""
    messages = [msg("user", task)]
    for number, (tool_call, output) in enumerate(steps):
        tool_call = {**tool_call, "id": f"call_{number}"}
        messages.append(assistant(tool_call))
        messages.append(result(f"call_{number}", tool_call["function"]["name"], output))
    messages.append(msg("assistant", "Done."))
    return make_case(messages, patch)


def question(case: Case, kind: str) -> Any:
    questions, omitted = build_questions(case, (kind,))
    assert not omitted, omitted
    (built,) = questions
    assert built.kind == kind
    assert built.question_id == f"{case.case_id}:{kind}"
    return built


def omission(case: Case, kind: str) -> str:
    questions, omitted = build_questions(case, (kind,))
    assert not questions
    return omitted[kind]


def assert_evidence_in_history(case: Case, built: Any) -> None:
    texts = history_texts(case)
    assert len(built.evidence_in) == len(built.evidence)
    for evidence, where in zip(built.evidence, built.evidence_in, strict=True):
        assert any(evidence in text for _i, w, text in texts if w == where), (evidence, where)


def swe_agent_run(*steps: tuple[str, str]) -> Case:
    """SWE-agent: actions in ``` blocks, observations sent back as user messages."""
    messages = [msg("user", "ISSUE:\nparse() fails on None\n\nINSTRUCTIONS: ...")]
    for action, observation in steps:
        messages.append(msg("assistant", f"Let me act.\n```\n{action}\n```"))
        messages.append(
            msg(
                "user",
                f"{observation}\n\n(Open file: {_open_file(observation)})\n"
                "(Current directory: /proj)\nbash-$",
            )
        )
    messages.append(msg("assistant", "Done."))
    return make_case(messages)


def _open_file(observation: str) -> str:
    return "/proj/pkg/mod.py" if "mod.py" in observation else "n/a"
