"""A system (or developer) message inside the history, through every door: Claude Code's
environment block at ``messages[1]`` for a model name it does not know (the real bodies of
``--model glm-4.6``), a developer note inside a Chat history or a Responses ``input``. It is
read, never a reason to skip the request; it is part of the fixed part (never summarized,
offloaded or cut); it goes back where it was, the client's own object, byte for byte; and the
views around it keep the tool-use protocol."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings

from policies.conversation import parse, role, shape_problem
from policies.pipeline import Checkpoint, build_policies
from policies.tokens import TokenCounter
from proxy.config.settings import Settings, policy_specs
from proxy.dialects.anthropic import AnthropicDialect
from proxy.dialects.anthropic_cache import breakpoints
from proxy.dialects.chat import ChatDialect
from proxy.dialects.responses import ResponsesDialect
from replay.session.doors import request
from tests.anthropic_protocol import problems, signatures
from tests.policies.conversations import conversation, with_instructions

CLIENTS = Path(__file__).resolve().parents[2] / "fixtures" / "clients"
COUNTER = TokenCounter()
POLICIES = build_policies(policy_specs(Settings()))
ANTHROPIC, CHAT, RESPONSES = AnthropicDialect(), ChatDialect(), ResponsesDialect()
# The real body asks for a 32,000-token answer and declares ~11.4k tokens of tools, both counted
# against the window: 64k is a small window for it (the grown history alone is ~60k tokens).
WINDOW = 65_536


def client_body(name: str) -> dict[str, Any]:
    body: dict[str, Any] = orjson.loads((CLIENTS / f"claude-code-unknown-model-{name}.json").read_bytes())
    return body


def grown(body: dict[str, Any], rounds: int) -> dict[str, Any]:
    """Claude Code's unknown-model turn 2 with ``rounds`` more tool rounds of its own shape
    (``[thinking, text, tool_use]``, then ``[tool_result]``; its breakpoint moved to the last
    result, as Claude Code moves it each turn)."""
    body = copy.deepcopy(body)
    messages = body["messages"]
    messages[-1]["content"][-1].pop("cache_control")
    for i in range(rounds):
        call = {"type": "tool_use", "id": f"toolu_{i:024d}", "name": "Bash"}
        call["input"] = {"command": f"cat part{i}.log", "description": "Show a log"}
        thinking = {"type": "thinking", "thinking": f"Step {i}.", "signature": f"sig-{i}"}
        messages.append(
            {"role": "assistant", "content": [thinking, {"type": "text", "text": f"Step {i}."}, call]}
        )
        output = "\n".join(f"part{i} line {n}: value={n * i} path=/srv/app/m{n % 7}.py" for n in range(250))
        result = {"tool_use_id": call["id"], "type": "tool_result", "content": output, "is_error": False}
        messages.append({"role": "user", "content": [result]})
    messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    return body


def through(
    dialect: Any, body: dict[str, Any], policy: str, window: int, checkpoint: Checkpoint | None = None
) -> tuple[dict[str, Any], Any]:
    """The wire body the proxy sends for ``body``, and the outcome."""
    parsed = dialect.parse(body)
    assert parsed.skipped is None, parsed.skipped
    outcome = asyncio.run(
        POLICIES[policy].apply(parsed.neutral, COUNTER, window=window, checkpoint=checkpoint)
    )
    if outcome.messages is None:
        return body, outcome
    return dialect.render(parsed, outcome.messages, outcome.origin or ()), outcome


def wire_systems(body: dict[str, Any]) -> list[Any]:
    return [m for m in body["messages"] if m.get("role") == "system"]


def system_texts(body: dict[str, Any]) -> list[str]:
    """The texts of the system messages in ``messages``, in order (two a compaction joined are
    one message with both texts)."""
    texts: list[str] = []
    for message in wire_systems(body):
        content = message["content"]
        texts += [content] if isinstance(content, str) else [b["text"] for b in content]
    return texts


@pytest.mark.parametrize("turn", ["turn1", "turn2"])
def test_the_unknown_model_bodies_are_read_with_their_system_message_in_place(turn: str) -> None:
    body = client_body(turn)
    parsed = ANTHROPIC.parse(body)
    assert parsed.skipped is None
    messages = parsed.neutral["messages"]
    roles = [m["role"] for m in messages]
    assert roles == ["system", "user", "system"] + (["assistant", "tool"] if turn == "turn2" else [])
    assert messages[2]["content"] == body["messages"][1]["content"]  # the environment block, whole
    # The conversation's fixed part: the system prompt, and the instruction after the task.
    assert [s.kind for s in parse(messages).steps][:3] == ["system", "user", "system"]
    # Counted with the request (it is what the model reads).
    without = {**body, "messages": [m for m in body["messages"] if m["role"] != "system"]}
    assert ANTHROPIC.count(body, COUNTER) > ANTHROPIC.count(without, COUNTER) + 500


@pytest.mark.parametrize("policy", ["improved", "n_latest_10", "sre", "improved_retry"])
def test_a_grown_unknown_model_session_is_compacted_around_its_system_message(policy: str) -> None:
    body = grown(client_body("turn2"), 12)
    original = copy.deepcopy(body)
    sent, outcome = through(ANTHROPIC, body, policy, WINDOW)
    assert sent is not body and outcome.tokens_after < outcome.tokens_before
    assert problems(sent) == [], problems(sent)
    # The environment block stays right after the task, the client's own object: byte for byte.
    assert sent["messages"][0] is body["messages"][0] and sent["messages"][1] is body["messages"][1]
    assert wire_systems(sent) == [body["messages"][1]]
    assert orjson.dumps(sent["messages"][1]) == orjson.dumps(original["messages"][1])
    # The system prompt as sent (``improved`` appends its guidance note), the tools as sent.
    assert sent["system"][: len(body["system"])] == body["system"] and sent["tools"] is body["tools"]
    assert signatures(sent).items() <= signatures(body).items()
    assert breakpoints(sent) <= 4
    assert body == original  # the client's body is never changed in place


@pytest.mark.parametrize("policy", ["improved", "n_latest_10"])
def test_turn_by_turn_the_system_message_keeps_its_place(policy: str) -> None:
    """Request after request (the checkpoint carried), the prefix before the tail is the
    client's task and environment block, whatever was summarized or cut after them."""
    checkpoint, compacted = None, 0
    for rounds in range(0, 15, 2):
        body = grown(client_body("turn2"), rounds)
        sent, outcome = through(ANTHROPIC, body, policy, WINDOW, checkpoint)
        checkpoint = outcome.checkpoint
        compacted += sent is not body
        assert problems(sent) == []
        assert sent["messages"][1] is body["messages"][1] and wire_systems(sent) == [body["messages"][1]]
    assert compacted >= 3


def test_a_system_message_of_blocks_goes_back_as_sent_and_is_not_merged() -> None:
    body = grown(client_body("turn2"), 10)
    blocks = [
        {"type": "text", "text": "Agent types: Explore, Plan."},
        {"type": "text", "text": "Skills: none."},
    ]
    blocks[-1]["cache_control"] = {"type": "ephemeral"}
    body["messages"][1] = {"role": "system", "content": blocks}
    note = {"role": "system", "content": "A second instruction, right after the first."}
    body["messages"].insert(2, note)
    parsed = ANTHROPIC.parse(body)
    assert parsed.neutral["messages"][2]["content"] == "Agent types: Explore, Plan.\nSkills: none."
    # Its breakpoint is a message's breakpoint for the replay's cost model.
    assert 3 in ANTHROPIC.cache_marks(parsed)
    sent, _ = through(ANTHROPIC, body, "improved", WINDOW)
    # Two the client sent in a row go as sent, each its own message.
    assert sent["messages"][1] is body["messages"][1] and sent["messages"][2] is note
    assert problems(sent) == problems(body) and breakpoints(sent) <= 4


def test_system_messages_a_compaction_brings_together_become_one() -> None:
    """Two instructions with steps between them: once those steps are cut, they would be two
    system messages in a row, which the API does not take; they are joined, each text whole."""
    body = grown(client_body("turn2"), 12)
    later = {"role": "system", "content": [{"type": "text", "text": "Plan mode is off now."}]}
    body["messages"].insert(6, later)
    sent, _ = through(ANTHROPIC, body, "n_latest_10", WINDOW)
    assert problems(sent) == [], problems(sent)
    systems = wire_systems(sent)
    assert len(systems) == 1 and sent["messages"][1] is systems[0]
    assert systems[0]["content"] == [
        {"type": "text", "text": body["messages"][1]["content"]},
        *later["content"],
    ]


@pytest.mark.parametrize("policy", sorted(POLICIES))
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(messages=with_instructions(conversation()))
def test_generated_messages_histories_with_system_messages_keep_the_protocol(
    policy: str, messages: list[Any]
) -> None:
    if messages[-1].get("role") == "assistant":
        messages = messages[:-1]  # a trailing call without results is not a Messages request
    body = request("anthropic", "glm-4.6", messages, [])
    assert wire_systems(body)
    original = copy.deepcopy(body)
    for window in (2_048, 6_000):
        sent, _ = through(ANTHROPIC, body, policy, window)
        if sent is not body:
            assert problems(sent) == [], problems(sent)
        # Every one kept, whole and in order (each the client's own object unless joined).
        assert system_texts(sent) == system_texts(body)
    assert body == original


@pytest.mark.parametrize("policy", ["improved", "n_latest_10", "sre"])
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(messages=with_instructions(conversation()))
def test_generated_chat_histories_with_system_messages_keep_the_protocol(
    policy: str, messages: list[Any]
) -> None:
    body = {"model": "glm-4.6", "messages": messages}
    inside = [m for m in messages[1:] if role(m) in ("system", "developer")]
    for window in (2_048, 6_000):
        sent, _ = through(CHAT, body, policy, window)
        view = sent["messages"]
        assert shape_problem(view) is None and parse(view).problems == ()
        assert [m for m in view if any(m is s for s in inside)] == inside


def codex_run(steps: int) -> dict[str, Any]:
    """Codex CLI's turn 4 grown by ``steps`` rounds, with a developer note and a system message
    inside its ``input`` (a mid-session permissions change, an IDE's note)."""
    body: dict[str, Any] = orjson.loads((CLIENTS / "codex-turn4.json").read_bytes())
    items = body["input"]
    for i in range(steps):
        call = {"type": "function_call", "call_id": f"call_g{i}", "name": "exec_command"}
        items.append({**call, "arguments": json.dumps({"cmd": f"cat part{i}.log"})})
        output = "\n".join(f"part{i} line {n}: ok" for n in range(200))
        items.append({"type": "function_call_output", "call_id": f"call_g{i}", "output": output})
        if i == 2:
            note = "Approval policy is now never; sandbox: workspace-write."
            items.append(
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": note}]}
            )
        if i == 5:
            items.append({"role": "system", "content": "The user switched the model to gpt-5-mini."})
    return body


@pytest.mark.parametrize("policy", ["improved", "n_latest_10"])
def test_a_developer_note_inside_a_responses_input_stays_in_place(policy: str) -> None:
    body = codex_run(12)
    leading = 2  # Codex's own two developer messages open the input
    inside = [i for i in body["input"][leading:] if i.get("role") in ("system", "developer")]
    assert len(inside) == 2
    sent, outcome = through(RESPONSES, body, policy, 16_000)
    assert sent is not body and outcome.tokens_after < outcome.tokens_before
    assert [i for i in sent["input"] if any(i is s for s in inside)] == inside
    calls = {i["call_id"] for i in sent["input"] if i.get("type") == "function_call"}
    outputs = {i["call_id"] for i in sent["input"] if i.get("type") == "function_call_output"}
    assert calls == outputs
