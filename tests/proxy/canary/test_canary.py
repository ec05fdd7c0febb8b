"""The canary's pure parts: arms, the providers' usage shapes per door, intervals, the gate."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.canary.gate import ArmFigures, Prices, arm_of
from proxy.canary.outcome import is_context_error, repeated_calls, usage_objects
from proxy.canary.stats import mean_difference, share_difference, wilson
from proxy.canary.verdict import judge
from proxy.config.sections import CanaryGate
from proxy.dialects.anthropic import AnthropicDialect
from proxy.dialects.base import Usage
from proxy.dialects.chat import ChatDialect
from proxy.dialects.gemini import GeminiDialect
from proxy.dialects.responses import ResponsesDialect
from proxy.telemetry.exchange import KEEP, AnswerCapture


def test_arms_are_sticky_and_split_near_the_share() -> None:
    arms = [arm_of("salt", "t_1", f"session-{i}", 0.1) for i in range(5000)]
    assert 400 <= arms.count("treated") <= 600
    assert arms == [arm_of("salt", "t_1", f"session-{i}", 0.1) for i in range(5000)]
    assert arm_of("salt", "t_1", "s", 0.0) == "holdout" and arm_of("salt", "t_1", "s", 1.0) == "treated"


def test_usage_is_read_from_each_providers_own_shape() -> None:
    chat = {
        "usage": {
            "prompt_tokens": 2006,
            "completion_tokens": 300,
            "prompt_tokens_details": {"cached_tokens": 1920},
        }
    }
    assert ChatDialect().billed(usage_objects(orjson.dumps(chat))) == Usage(2006, 1920, 0, 300)
    responses = {
        "type": "response.completed",
        "response": {
            "usage": {
                "input_tokens": 5000,
                "input_tokens_details": {"cached_tokens": 4096},
                "output_tokens": 80,
            }
        },
    }
    stream = b"event: response.completed\ndata: " + orjson.dumps(responses) + b"\n\n"
    assert ResponsesDialect().billed(usage_objects(stream)) == Usage(5000, 4096, 0, 80)
    start = {
        "type": "message_start",
        "message": {
            "usage": {
                "input_tokens": 12,
                "cache_read_input_tokens": 9000,
                "cache_creation_input_tokens": 500,
                "output_tokens": 1,
            }
        },
    }
    delta = {"type": "message_delta", "usage": {"output_tokens": 250}}
    events = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in (start, delta))
    assert AnthropicDialect().billed(usage_objects(events)) == Usage(9512, 9000, 500, 250)
    # Gemini: every chunk of a stream repeats usageMetadata, the last one complete.
    chunks = [
        {"candidates": [], "usageMetadata": {"promptTokenCount": 7000, "cachedContentTokenCount": 4096}},
        {
            "candidates": [],
            "usageMetadata": {
                "promptTokenCount": 7000,
                "cachedContentTokenCount": 4096,
                "candidatesTokenCount": 120,
                "thoughtsTokenCount": 30,
            },
        },
    ]
    gemini = b"".join(b"data: " + orjson.dumps(c) + b"\r\n\r\n" for c in chunks)
    assert GeminiDialect().billed(usage_objects(gemini)) == Usage(7000, 4096, 0, 150)


def test_the_capture_keeps_both_ends_and_sees_a_tool_call_in_the_middle() -> None:
    capture = AnswerCapture(b'"tool_calls"')
    capture.take(b"a" * 70_000)
    capture.take(b'{"tool_calls":[]}')
    capture.take(b"b" * 200_000 + b'"usage":{"prompt_tokens":7}')
    raw = capture.raw()
    assert capture.tool_call and raw.startswith(b"a") and raw.endswith(b"7}") and len(raw) <= 2 * 64 * 1024


def test_context_errors_in_each_providers_words() -> None:
    assert is_context_error(400, b'{"error":{"code":"context_length_exceeded"}}')
    assert is_context_error(400, b'{"type":"error","error":{"message":"prompt is too long: 210000 tokens"}}')
    assert not is_context_error(400, b'{"error":{"message":"bad tool schema"}}')
    google = (
        b'{"error":{"code":400,"message":"The input token count (40321) exceeds the maximum number '
        b'of tokens allowed (32768).","status":"INVALID_ARGUMENT"}}'
    )
    assert is_context_error(400, google)
    assert not is_context_error(500, b"context_length_exceeded")


def test_a_repeated_tool_call_is_counted_once_it_recurs() -> None:
    def call(arguments: str) -> dict[str, Any]:
        return {
            "role": "assistant",
            "tool_calls": [{"id": "x", "function": {"name": "bash", "arguments": arguments}}],
        }

    messages = [call('{"cmd": "ls"}'), {"role": "tool", "content": "a"}, call('{"cmd":  "ls"}')]
    assert repeated_calls(messages) == 1
    assert repeated_calls(messages[:1]) == 0


def test_intervals() -> None:
    low, high = wilson(0, 200)
    assert low == 0 and 0.015 < high < 0.02
    estimate, (lower, upper) = share_difference(50, 100, 0, 100)
    assert estimate == 0.5 and lower > 0.3 and upper < 0.65
    estimate, (lower, upper) = mean_difference([2.0] * 50, [1.0] * 50, ratio=1.5)
    assert estimate == 0.5 and lower == upper == 0.5


def arm(name: str, sessions: int, **figures: float) -> ArmFigures:
    return ArmFigures(name, [{"arm": name, "requests": 5, "cost": 1.0, **figures} for _ in range(sessions)])


def test_the_gate_waits_passes_and_breaches() -> None:
    gate = CanaryGate(min_sessions=30)
    assert judge({"treated": arm("treated", 10), "holdout": arm("holdout", 40)}, gate).state == "waiting"
    healthy = judge({"treated": arm("treated", 60, cost=0.5), "holdout": arm("holdout", 60)}, gate)
    assert healthy.state == "pass", healthy
    errors = judge({"treated": arm("treated", 40, context_errors=2), "holdout": arm("holdout", 40)}, gate)
    assert [c.name for c in errors.breached] == ["context_error_share"]
    rereads = judge({"treated": arm("treated", 60, reads=4), "holdout": arm("holdout", 60, repeats=1)}, gate)
    assert [c.name for c in rereads.breached] == ["reacquisitions_per_session"]
    costly = judge({"treated": arm("treated", 60, cost=2.0), "holdout": arm("holdout", 60)}, gate)
    assert [c.name for c in costly.breached] == ["cost_per_session"]


def test_cost_in_dollars_with_prices_else_in_input_tokens() -> None:
    usage = Usage(prompt=1_000_000, cached=500_000, written=0, output=100_000)
    assert (
        Prices(2.5, 1.25, None, 10.0).cost(usage, cached_ratio=0.5, write_ratio=1.0)
        == 2.5 * 0.5 + 1.25 * 0.5 + 1.0
    )
    assert Prices().cost(usage, cached_ratio=0.5, write_ratio=1.0) == 500_000 + 250_000 + 400_000


class _Book:
    def __init__(self, arms: dict[str, str]) -> None:
        self.arms = arms

    async def arm(self, key: str) -> str | None:
        return self.arms.get(key)


async def test_a_request_is_placed_by_its_session_and_paused_sessions_keep_their_arm() -> None:
    from proxy.canary.runtime import CanaryArms, place_in_arm
    from proxy.config.sections import CanarySettings
    from proxy.telemetry.exchange import Exchange

    def exchange() -> Exchange:
        return Exchange(request_id="r", route="chat", method="POST", started=0.0)

    arms = CanaryArms(CanarySettings(share=1.0), _Book({"t\x1fold": "treated"}))  # type: ignore[arg-type]
    compaction = {
        "messages": [{"role": "user", "content": "Your task is to create a detailed summary of it."}]
    }
    treated = exchange()
    assert (
        await place_in_arm(arms, treated, [(b"x-session-id", b"old")], "t", compaction, b'"tool_calls"')
        == "treated"
    )
    assert treated.canary_key == "t\x1fold" and treated.canary_capture is not None
    arms.observe_state({"paused": {"time": 1.0}, "epoch": 0.0})
    assert (
        await place_in_arm(arms, exchange(), [(b"x-session-id", b"old")], "t", None, b'"tool_calls"')
        == "treated"
    )
    held = exchange()
    assert (
        await place_in_arm(arms, held, [(b"x-session-id", b"new")], "t", compaction, b'"tool_calls"')
        == "holdout"
    )
    assert held.dialect_notes["agent_compaction"] == {"agent": "claude-code"}
    # No session id and no readable body: the holdout.
    assert await place_in_arm(arms, exchange(), [], "t", None, b'"tool_calls"') == "holdout"


def test_an_answer_written_in_one_piece_keeps_its_end() -> None:
    """A held stream goes to the client in one write: what does not fit the head is the tail."""
    end = b'data: {"usage":{"prompt_tokens":7}}\n\ndata: [DONE]\n\n'
    capture = AnswerCapture(b'"tool_calls"')
    capture.take(b"data: " + b"x" * (KEEP + 500) + b"\n\n" + end)
    assert capture.raw().endswith(end)
    assert usage_objects(capture.raw()) == [{"prompt_tokens": 7}]
