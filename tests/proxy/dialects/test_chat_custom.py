"""GPT-5 custom tools through the Chat Completions door: a call ``{"type": "custom", "custom":
{"name", "input"}}`` is read as a call (an ``apply_patch`` patch as an edit), a history that
has them is compacted, untouched messages go back as the very objects the client sent, and a
rewritten message keeps its custom calls in their custom shape. The Responses door's
``custom_tool_call`` items are compacted the same way."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import orjson

from policies.actions import EDIT_KINDS
from policies.conversation import parse, shape_problem
from policies.handles import ARGUMENT_PREFIX
from policies.message_actions import call_action
from policies.pipeline import build_policies
from policies.tokens import TokenCounter
from proxy.config.settings import Settings, policy_specs
from proxy.dialects.base import NOT_RUN, Answer
from proxy.dialects.chat import ChatDialect
from proxy.dialects.responses import ResponsesDialect
from proxy.read_tool.tool import TOOL_NAME
from tests.proxy.dialects.test_chat_stream import chunk, play

DIALECT = ChatDialect()
COUNTER = TokenCounter()
POLICIES = build_policies(policy_specs(Settings()))

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "exec_command",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    },
    {
        "type": "custom",
        "custom": {
            "name": "apply_patch",
            "description": "Edit files with a patch.",
            "format": {
                "type": "grammar",
                "grammar": {"syntax": "lark", "definition": 'start: "*** Begin Patch" /(.|\\n)*/'},
            },
        },
    },
    {"type": "custom", "custom": {"name": "note", "description": "Free text.", "format": {"type": "text"}}},
]


def patch(i: int, lines: int) -> str:
    body = "\n".join(f"+    value_{i}_{n} = compute({n}, 'step {i}')" for n in range(lines))
    return f"*** Begin Patch\n*** Add File: src/module_{i}.py\n{body}\n*** End Patch"


def custom_call(call_id: str, name: str, text: str) -> dict[str, Any]:
    return {"id": call_id, "type": "custom", "custom": {"name": name, "input": text}}


def session(steps: int, patch_lines: int = 200) -> dict[str, Any]:
    """A GPT-5 agent's chat history: shell calls with long outputs, a large ``apply_patch``
    custom call every third step, and a ``note`` custom call beside a shell call."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Add the modules and make the tests pass."},
    ]
    for i in range(steps):
        if i % 3 == 1:
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [custom_call(f"call_p{i}", "apply_patch", patch(i, patch_lines))],
                }
            )
            messages.append(
                {"role": "tool", "tool_call_id": f"call_p{i}", "content": "Success. Updated files."}
            )
            continue
        shell = {
            "id": f"call_s{i}",
            "type": "function",
            "function": {"name": "exec_command", "arguments": json.dumps({"cmd": f"pytest -k t{i}"})},
        }
        calls = [shell, custom_call(f"call_n{i}", "note", f"checking t{i}")] if i % 3 == 2 else [shell]
        messages.append({"role": "assistant", "content": f"Step {i}.", "tool_calls": calls})
        messages.append(
            {
                "role": "tool",
                "tool_call_id": f"call_s{i}",
                "content": "\n".join(f"t{i} line {n}: " + "ok " * 12 for n in range(80)),
            }
        )
        if i % 3 == 2:
            messages.append({"role": "tool", "tool_call_id": f"call_n{i}", "content": "Noted."})
    return {"model": "gpt-5", "messages": messages, "tools": TOOLS}


def compact(body: dict[str, Any], window: int, policy: str = "improved") -> tuple[dict[str, Any], Any]:
    parsed = DIALECT.parse(body)
    assert parsed.skipped is None
    outcome = asyncio.run(POLICIES[policy].apply(parsed.neutral, COUNTER, window=window))
    assert outcome.messages is not None and outcome.origin is not None
    return DIALECT.render(parsed, outcome.messages, outcome.origin), outcome


def customs(messages: list[Any]) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for m in messages for c in m.get("tool_calls") or [] if c["type"] == "custom"}


def protocol_problems(messages: list[Any]) -> list[str]:
    calls = {c["id"] for m in messages for c in m.get("tool_calls") or []}
    results = {m["tool_call_id"] for m in messages if m["role"] == "tool"}
    return [f"call {c} without result" for c in calls - results] + [
        f"result {r} without call" for r in results - calls
    ]


def test_custom_calls_are_read_as_calls_and_go_back_as_sent() -> None:
    body = session(9)
    parsed = DIALECT.parse(body)
    assert parsed.skipped is None
    neutral = parsed.neutral["messages"]
    assert parse(neutral).problems == ()
    call = neutral[4]["tool_calls"][0]
    assert call["type"] == "function" and call["function"]["name"] == "apply_patch"
    assert json.loads(call["function"]["arguments"]) == {"input": patch(1, 200)}
    action = call_action(call)
    assert action.kind in EDIT_KINDS and action.paths == ("src/module_1.py",)
    # A message without custom calls is the client's own object; the body is untouched.
    assert neutral[2] is body["messages"][2] and body["messages"][4]["tool_calls"][0]["type"] == "custom"
    assert parsed.neutral["tools"] == TOOLS
    view = DIALECT.render(parsed, neutral, range(len(neutral)))
    assert all(a is b for a, b in zip(view["messages"], body["messages"], strict=True))
    assert orjson.dumps(view) == orjson.dumps(body)


def test_custom_inputs_are_counted() -> None:
    body = session(9)
    plain = {**body, "messages": [m for m in body["messages"] if not customs([m])]}
    with_patch = DIALECT.count(body, COUNTER)
    assert (
        with_patch - DIALECT.count(plain, COUNTER) > COUNTER.count_text(patch(1, 200), "o200k_base") * 3 // 4
    )


def test_a_compacted_view_keeps_custom_calls_in_their_shape() -> None:
    body = session(30)
    view, outcome = compact(body, window=16_000)
    messages = view["messages"]
    assert outcome.tokens_after < outcome.tokens_before
    assert shape_problem(messages) is None and DIALECT.parse(view).skipped is None
    assert protocol_problems(messages) == []
    sent, originals = customs(messages), customs(body["messages"])
    assert sent and set(sent) <= set(originals)
    for call_id, call in sent.items():
        # Every field as the client sent it; only the input may be a placeholder.
        original = originals[call_id]
        assert {**call, "custom": {**call["custom"], "input": None}} == {
            **original,
            "custom": {**original["custom"], "input": None},
        }
        assert isinstance(call["custom"]["input"], str)
    # A large patch left the view for its handle, its call still a custom apply_patch call.
    saved = [c for c in sent.values() if c["custom"]["input"].startswith(ARGUMENT_PREFIX)]
    assert saved and all(c["custom"]["name"] == "apply_patch" for c in saved)
    stored = [o.content for o in outcome.offloads.values()]
    assert all(any(originals[c["id"]]["custom"]["input"] in text for text in stored) for c in saved)
    # Untouched messages are the very objects the client sent.
    wire = {id(m) for m in body["messages"]}
    assert sum(id(m) in wire for m in messages) >= 4
    assert messages[-3:] == body["messages"][-3:] and messages[-1] is body["messages"][-1]
    assert DIALECT.count(view, COUNTER) == outcome.tokens_after


def test_every_policy_keeps_custom_calls_valid() -> None:
    body = session(30)
    for policy in POLICIES:
        parsed = DIALECT.parse(body)
        outcome = asyncio.run(POLICIES[policy].apply(parsed.neutral, COUNTER, window=16_000))
        if outcome.messages is None:
            continue
        view = DIALECT.render(parsed, outcome.messages, outcome.origin or ())
        assert shape_problem(view["messages"]) is None, policy
        assert protocol_problems(view["messages"]) == [], policy
        assert not any(
            c["type"] == "function" and c["function"]["name"] in ("apply_patch", "note")
            for m in view["messages"]
            for c in m.get("tool_calls") or []
        ), policy


def test_a_malformed_custom_call_is_named() -> None:
    body = session(3)
    bad = json.loads(json.dumps(body))
    bad["messages"][4]["tool_calls"][0]["custom"] = "apply_patch"
    assert DIALECT.parse(bad).skipped == "messages[4].tool_calls[0].custom must be an object"
    bad["messages"][4]["tool_calls"][0]["custom"] = {"name": "apply_patch"}
    assert DIALECT.parse(bad).skipped == "messages[4].tool_calls[0].custom.input must be a string"
    bad["messages"][4]["tool_calls"][0]["custom"] = {"name": 3, "input": "x"}
    assert DIALECT.parse(bad).skipped == "messages[4].tool_calls[0].custom.name must be a string"


def test_the_responses_door_offloads_a_large_custom_patch_as_an_edit() -> None:
    dialect = ResponsesDialect()
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Add the modules."}]}
    ]
    for i in range(24):
        if i % 3 == 1:
            items.append(
                {
                    "type": "custom_tool_call",
                    "id": f"ctc_{i}",
                    "call_id": f"call_p{i}",
                    "name": "apply_patch",
                    "input": patch(i, 200),
                }
            )
            items.append({"type": "custom_tool_call_output", "call_id": f"call_p{i}", "output": "Success."})
            continue
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{i}",
                "call_id": f"call_s{i}",
                "name": "exec_command",
                "arguments": json.dumps({"cmd": f"pytest -k t{i}"}),
            }
        )
        output = "\n".join(f"t{i} line {n}: " + "ok " * 12 for n in range(80))
        items.append({"type": "function_call_output", "call_id": f"call_s{i}", "output": output})
    body = {"model": "gpt-5", "instructions": "You are a coding agent.", "input": items, "tools": []}
    parsed = dialect.parse(body)
    assert parsed.skipped is None
    outcome = asyncio.run(POLICIES["improved"].apply(parsed.neutral, COUNTER, window=16_000))
    assert outcome.messages is not None and outcome.origin is not None
    view = dialect.render(parsed, outcome.messages, outcome.origin)["input"]
    by_id = {i["id"]: i for i in items if "id" in i}
    patches = [i for i in view if i.get("type") == "custom_tool_call"]
    saved = [i for i in patches if i["input"].startswith(ARGUMENT_PREFIX)]
    assert saved
    for item in patches:
        assert {**item, "input": None} == {**by_id[item["id"]], "input": None}
    calls = {i["call_id"] for i in view if i.get("type") in ("function_call", "custom_tool_call")}
    outputs = {
        i["call_id"] for i in view if i.get("type") in ("function_call_output", "custom_tool_call_output")
    }
    assert calls == outputs


PIECES = ("*** Begin", " Patch\n*** Update File: a.py\n@@\n-a\n", "+b\n*** End Patch")


def test_a_streamed_custom_call_is_gathered_in_its_custom_shape() -> None:
    """A round that calls a custom tool beside the read tool: the read loop appends the round
    with the custom call as the model made it (the client's own call, not run yet)."""
    read = {"index": 0, "id": "call_r", "type": "function", "function": {"name": TOOL_NAME, "arguments": ""}}
    opening = {"index": 1, "id": "call_p", "type": "custom", "custom": {"name": "apply_patch", "input": ""}}
    events = [
        chunk({"role": "assistant", "content": None, "tool_calls": [read, opening]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"handle": "out_1"}'}}]}),
        *(chunk({"tool_calls": [{"index": 1, "custom": {"input": piece}}]}) for piece in PIECES),
        chunk({}, finish="tool_calls"),
    ]
    stream, _, _ = play(b"".join(events))
    read_call, patch_call = stream.calls()
    assert DIALECT.is_read_call(read_call) and not DIALECT.is_read_call(patch_call)
    assert patch_call == custom_call("call_p", "apply_patch", "".join(PIECES))
    body = DIALECT.add_round(
        session(3), Answer(calls=[read_call, patch_call]), [(read_call, "x"), (patch_call, NOT_RUN)]
    )
    assert shape_problem(body["messages"]) is None and protocol_problems(body["messages"]) == []
    # Shadow comparisons read the custom call as the edit it is.
    alone = [chunk({"role": "assistant", "tool_calls": [{**opening, "index": 0}]}), *events[2:]]
    alone = [e.replace(b'"index":1', b'"index":0') for e in alone]
    assert DIALECT.decision(b"".join(alone), True) == "apply_patch: a.py"
