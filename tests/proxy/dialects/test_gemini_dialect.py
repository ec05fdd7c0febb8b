"""The Gemini adapter: real Gemini CLI bodies (the Gemini API's and Code Assist's) read and
written back byte for byte, changed contents keep every part and field but their new text,
args or response (thought parts and signatures in their part), calls without ids paired as
the API pairs them, and every view of every shipped policy keeps the Gemini protocol, over
every sample trajectory request by request and over generated conversations."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings

from policies.conversation import parse, role
from policies.pipeline import build_policies
from policies.tokens import TokenCounter
from proxy.config.settings import Settings, policy_specs
from proxy.dialects import make_dialects
from proxy.dialects.doors import Target
from proxy.dialects.gemini_contents import CALL_PREFIX, OPENING
from replay.recording.rows import iter_rows, row_messages, row_tools
from tests.gemini_protocol import problems, signed
from tests.policies.conversations import conversation

ROOT = Path(__file__).resolve().parents[3]
GEMINI = ROOT / "tests" / "fixtures" / "gemini"
SAMPLE = ROOT / "tests" / "fixtures" / "sample_trajectories.jsonl"  # the 68 sample rows
COUNTER = TokenCounter()
POLICIES = build_policies(policy_specs(Settings()))
MODEL = "gemini-3.8-flash"
DIALECT = make_dialects()["gemini"].at(Target(model=MODEL, stream=True))
CODE_ASSIST = make_dialects()["code_assist"].at(Target(stream=True))
BODIES = sorted(
    p.name for p in GEMINI.glob("gemini-cli-*.json") if not p.name.endswith(("headers.json", "side.json"))
)


def fixture(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((GEMINI / name).read_text())
    return body


def adapter(name: str) -> Any:
    return CODE_ASSIST if "code-assist" in name else DIALECT


def through(
    body: dict[str, Any], policy: str, window: int, checkpoint: Any = None
) -> tuple[dict[str, Any], Any]:
    """The wire body the proxy sends for ``body`` under ``policy``, and the outcome."""
    parsed = DIALECT.parse(body)
    outcome = asyncio.run(
        POLICIES[policy].apply(parsed.neutral, COUNTER, window=window, checkpoint=checkpoint)
    )
    if outcome.messages is None:
        return body, outcome
    return DIALECT.render(parsed, outcome.messages, outcome.origin or ()), outcome


@pytest.mark.parametrize("name", BODIES)
def test_gemini_cli_bodies_go_back_byte_for_byte(name: str) -> None:
    body = fixture(name)
    parsed = adapter(name).parse(body)
    assert parsed.skipped is None
    messages = parsed.neutral["messages"]
    assert parse(messages).problems == ()
    rendered = adapter(name).render(parsed, messages, range(len(messages)))
    assert orjson.dumps(rendered) == orjson.dumps(body)
    contents = rendered["request"]["contents"] if "code-assist" in name else rendered["contents"]
    original = body["request"]["contents"] if "code-assist" in name else body["contents"]
    # Every untouched content is the client's own object.
    assert all(a is b for a, b in zip(contents, original, strict=True))


def test_the_model_and_the_stream_are_the_paths() -> None:
    parsed = DIALECT.parse(fixture("gemini-cli-turn1.json"))
    assert parsed.neutral["model"] == MODEL and parsed.stream is True
    other = make_dialects()["gemini"].at(Target(model="gemini-2.5-pro", stream=False))
    assert other.parse(fixture("gemini-cli-turn1.json")).neutral["model"] == "gemini-2.5-pro"
    assert not other.streams({}) and DIALECT.streams({}) and DIALECT.model_of({}) == MODEL
    assert DIALECT.at(Target(model=MODEL, stream=True)) is DIALECT
    assert (
        CODE_ASSIST.parse(fixture("gemini-cli-code-assist-turn2.json")).neutral["model"] == "gemini-2.5-pro"
    )


def test_gemini_cli_history_reads_into_the_neutral_conversation() -> None:
    parsed = DIALECT.parse(fixture("gemini-cli-turn4.json"))
    messages = parsed.neutral["messages"]
    assert [m["role"] for m in messages] == ["system", "user"] + ["assistant", "tool"] * 3
    call = messages[2]["tool_calls"][0]
    assert call["id"] == "run_shell_command_1796530657313_0"
    assert call["function"]["name"] == "run_shell_command"
    assert json.loads(call["function"]["arguments"])["command"] == "ls -la"
    assert messages[2]["content"] == "Turn 1: running `ls -la`."
    result = messages[3]
    assert result["tool_call_id"] == call["id"] and result["name"] == "run_shell_command"
    assert result["content"].startswith("<untrusted_context>\nOutput: total 20")  # response.output
    assert [t["function"]["name"] for t in parsed.neutral["tools"]][:3] == [
        "update_topic",
        "list_directory",
        "read_file",
    ]
    assert parsed.notes["thought_signatures"] == 3


def test_thought_parts_are_counted_never_shown_and_stay_in_their_part() -> None:
    body = fixture("gemini-cli-turn2.json")
    thought = {"text": "I should list the files first.", "thought": True}
    body["contents"][1]["parts"].insert(0, thought)
    parsed = DIALECT.parse(body)
    assistant = parsed.neutral["messages"][2]
    assert assistant["wire_only"] == thought["text"] and assistant["content"] == "Turn 1: running `ls -la`."
    without = {k: v for k, v in assistant.items() if k != "wire_only"}
    assert COUNTER.count_message(assistant, "o200k_base") > COUNTER.count_message(without, "o200k_base")
    view = list(parsed.neutral["messages"])
    view[2] = {**view[2], "content": "Listing."}
    rendered = DIALECT.render(parsed, view, range(len(view)))
    parts = rendered["contents"][1]["parts"]
    assert parts[0] is thought and parts[1] == {"text": "Listing."}
    assert parts[2] is body["contents"][1]["parts"][2]  # the call and its signature
    assert signed(rendered) == signed(body)


def test_a_changed_result_keeps_its_id_name_and_shape() -> None:
    body = fixture("gemini-cli-turn4.json")
    parsed = DIALECT.parse(body)
    view = list(parsed.neutral["messages"])
    view[3] = {**view[3], "content": "[output saved: handle=out_0123456789abcdef]"}
    rendered = DIALECT.render(parsed, view, range(len(view)))
    assert problems(rendered) == []
    (part,) = rendered["contents"][2]["parts"]
    original = body["contents"][2]["parts"][0]["functionResponse"]
    assert part["functionResponse"] == {**original, "response": {"output": view[3]["content"]}}
    assert (
        rendered["contents"][3:] == body["contents"][3:] and rendered["contents"][:2] == body["contents"][:2]
    )
    assert signed(rendered) == signed(body)


def test_changed_arguments_keep_the_calls_id_and_signature() -> None:
    body = fixture("gemini-cli-turn2.json")
    parsed = DIALECT.parse(body)
    view = list(parsed.neutral["messages"])
    call = view[2]["tool_calls"][0]
    new_call = {**call, "function": {**call["function"], "arguments": '{"command": "ls"}'}}
    view[2] = {**view[2], "tool_calls": [new_call]}
    rendered = DIALECT.render(parsed, view, range(len(view)))
    part = rendered["contents"][1]["parts"][1]
    original = body["contents"][1]["parts"][1]
    assert part["thoughtSignature"] == original["thoughtSignature"]
    assert part["functionCall"] == {**original["functionCall"], "args": {"command": "ls"}}


def summarized(body: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``body`` rendered with its middle replaced by a summary (system, task, summary, the last
    two steps)."""
    parsed = DIALECT.parse(body)
    messages = parsed.neutral["messages"]
    summary = {"role": "user", "content": "Summary of the work so far: listed files."}
    view = [messages[0], messages[1], summary, *messages[-2:]]
    origin = [0, 1, -1, len(messages) - 2, len(messages) - 1]
    return parsed, DIALECT.render(parsed, view, origin)


def test_a_summary_keeps_the_protocol_and_the_kept_turns_signatures() -> None:
    body = fixture("gemini-cli-turn4.json")
    _, rendered = summarized(body)
    assert problems(rendered) == []
    contents = rendered["contents"]
    assert contents[0] is body["contents"][0]
    assert contents[1] == {"role": "user", "parts": [{"text": "Summary of the work so far: listed files."}]}
    assert contents[2:] == body["contents"][-2:] and contents[2] is body["contents"][-2]
    assert [s for _, _, s in signed(rendered)] == [s for _, _, s in signed(body)][-1:]


def test_a_view_opening_with_the_model_gets_a_user_opening() -> None:
    body = fixture("gemini-cli-turn3.json")
    parsed = DIALECT.parse(body)
    messages = parsed.neutral["messages"]
    rendered = DIALECT.render(parsed, [messages[0], *messages[4:]], [0, 4, 5])
    assert rendered["contents"][0] == {"role": "user", "parts": [{"text": OPENING}]}
    assert problems(rendered) == []


def test_a_new_system_note_joins_the_system_instruction() -> None:
    body = fixture("gemini-cli-turn3.json")
    parsed = DIALECT.parse(body)
    messages = parsed.neutral["messages"]
    note = {"role": "system", "content": "Read saved outputs before quoting them."}
    rendered = DIALECT.render(parsed, [messages[0], note, *messages[1:]], [0, -1, *range(1, len(messages))])
    system = rendered["systemInstruction"]
    assert system["role"] == "user" and system["parts"][:-1] == body["systemInstruction"]["parts"]
    assert system["parts"][-1] == {"text": note["content"]}
    assert rendered["contents"] == body["contents"]


def test_calls_without_ids_pair_with_their_results_in_order_and_by_name() -> None:
    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "Look around."}]},
            {
                "role": "model",
                "parts": [
                    {"functionCall": {"name": "ls", "args": {}}, "thoughtSignature": "c2ln"},
                    {"functionCall": {"name": "pwd", "args": {}}},
                ],
            },
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "pwd", "response": {"output": "/src"}}},
                    {"functionResponse": {"name": "ls", "response": {"output": "a.py"}}},
                ],
            },
        ]
    }
    parsed = DIALECT.parse(body)
    _, assistant, first, second = parsed.neutral["messages"]
    ids = [c["id"] for c in assistant["tool_calls"]]
    assert ids == [f"{CALL_PREFIX}1-0", f"{CALL_PREFIX}1-1"]
    assert (first["tool_call_id"], first["content"]) == (ids[1], "/src")
    assert (second["tool_call_id"], second["content"]) == (ids[0], "a.py")
    assert parse(parsed.neutral["messages"]).problems == ()
    view = list(parsed.neutral["messages"])
    view[2] = {**view[2], "content": "[saved]"}
    rendered = DIALECT.render(parsed, view, range(len(view)))
    assert b"gemini-call" not in orjson.dumps(rendered)  # made ids never reach the wire
    assert rendered["contents"][2]["parts"][0]["functionResponse"] == {
        "name": "pwd",
        "response": {"output": "[saved]"},
    }


def test_snake_case_fields_are_read_and_kept() -> None:
    body = {
        "system_instruction": {"parts": [{"text": "Be brief."}]},
        "contents": [
            {"role": "user", "parts": [{"text": "Run it."}]},
            {
                "role": "model",
                "parts": [{"function_call": {"id": "c1", "name": "sh", "args": {"cmd": "make"}}}],
            },
            {
                "role": "user",
                "parts": [{"function_response": {"id": "c1", "name": "sh", "response": {"out": "ok"}}}],
            },
        ],
        "generation_config": {"max_output_tokens": 512},
    }
    parsed = DIALECT.parse(body)
    assert [m["role"] for m in parsed.neutral["messages"]] == ["system", "user", "assistant", "tool"]
    assert parsed.neutral["max_tokens"] == 512 and parsed.neutral["messages"][3]["content"] == "ok"
    view = list(parsed.neutral["messages"])
    view[3] = {**view[3], "content": "[saved]"}
    rendered = DIALECT.render(parsed, view, range(len(view)))
    assert rendered["contents"][2]["parts"][0] == {
        "function_response": {"id": "c1", "name": "sh", "response": {"out": "[saved]"}}
    }


def test_malformed_histories_and_held_histories_go_as_sent() -> None:
    assert DIALECT.parse({"contents": [{"role": "tool", "parts": [{"text": "x"}]}]}).skipped
    assert DIALECT.parse({"contents": [{"role": "user", "parts": "x"}]}).skipped
    assert DIALECT.parse({"contents": [{"role": "user", "parts": [7]}]}).skipped
    assert DIALECT.parse({"contents": [{"role": "model", "parts": [{"functionCall": {}}]}]}).skipped
    held = {"contents": [{"role": "user", "parts": [{"text": "x"}]}], "cachedContent": "cachedContents/abc"}
    assert DIALECT.parse(held).skipped == "cachedContent: part of the history is held upstream"
    several = {"contents": held["contents"], "generationConfig": {"candidateCount": 2}}
    assert DIALECT.parse(several).skipped


def test_media_is_estimated_and_noted() -> None:
    image = {"inlineData": {"mimeType": "image/png", "data": "iVBOR" * 100}}
    body = {"contents": [{"role": "user", "parts": [{"text": "What is this?"}, image]}]}
    parsed = DIALECT.parse(body)
    (message,) = parsed.neutral["messages"]
    assert message["wire_tokens"] == 1120 and parsed.notes["media"] == 1
    assert message["content"][1] == {"type": "text", "text": "[inlineData image/png]"}


def requests_of(messages: list[Any]) -> list[list[Any]]:
    return [messages[:i] for i, m in enumerate(messages) if role(m) == "assistant" and i > 0]


@pytest.mark.parametrize("policy", ["improved", "n_latest_10", "sre", "improved_retry"])
def test_every_view_of_every_sample_trajectory_keeps_the_protocol(policy: str) -> None:
    views = rewritten = 0
    for row in list(iter_rows(SAMPLE)):
        messages, tools = row_messages(row), row_tools(row)
        checkpoint = None
        previous: list[Any] | None = None
        for history in requests_of(messages):
            body = DIALECT.client_request(MODEL, history, tools)
            sent, outcome = through(body, policy, 8_192, checkpoint)
            checkpoint = outcome.checkpoint
            found = problems(sent) if sent is not body else []
            assert found == [], (row["instance_id"], len(history), found)
            if previous is not None and outcome.trigger is None and policy.startswith("improved"):
                # Between compaction points the sent prefix only grows (the implicit cache keeps
                # hitting), but for the previous view's final step in a tight session.
                final = max(
                    (i for i, c in enumerate(previous) if c["role"] == "model"), default=len(previous)
                )
                assert sent["contents"][:final] == previous[:final], (row["instance_id"], len(history))
            previous = sent["contents"]
            views += 1
            rewritten += sent is not body
    assert views > 500 and rewritten > 100


@pytest.mark.parametrize("policy", sorted(POLICIES))
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(messages=conversation())
def test_generated_conversations_keep_the_protocol(policy: str, messages: list[Any]) -> None:
    if messages[-1].get("role") == "assistant":
        messages = messages[:-1]  # a trailing call without results is not a request
    body = DIALECT.client_request(MODEL, messages, [])
    original = copy.deepcopy(body)
    for window in (2_048, 6_000):
        sent, _ = through(body, policy, window)
        if sent is not body:
            assert problems(sent) == [], problems(sent)
    assert body == original  # the client's body is never changed in place
