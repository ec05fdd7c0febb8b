"""Event schema and content for each mechanism (built from real policy outcomes)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from policies.pipeline import Checkpoint, build_policy
from policies.tokens import TokenCounter
from proxy.state.store import encode_checkpoint
from proxy.telemetry.events import SCHEMA_VERSION, CheckpointJson, build_event, new_event_id
from tests.policies.test_mechanisms import IMPROVED, SYSTEM, TASK, figure_5, step, words

COUNTER = TokenCounter()


def event_for(stages: list[Any], messages: list[Any], window: int, safeguard: bool = False) -> dict[str, Any]:
    policy = build_policy("p", "", stages, safeguard=safeguard)
    outcome = asyncio.run(policy.apply({"model": "gpt-4o", "messages": messages}, COUNTER, window=window))
    return build_event(
        request_id="cpx-1",
        tenant="t_x",
        session="s_y:p",
        model="gpt-4o",
        mode="enforce",
        policy="p",
        policy_version="0.1.0",
        policy_hash="abcd",
        outcome=outcome,
        messages_before=len(messages),
        reads=None,
    )


REQUIRED = {
    "schema_version",
    "event_id",
    "time",
    "request_id",
    "tenant",
    "session",
    "model",
    "mode",
    "policy",
    "policy_version",
    "policy_config_hash",
    "mechanisms",
    "trigger",
    "threshold",
    "window",
    "parent_range",
    "tokens_before",
    "tokens_after",
    "messages_before",
    "messages_after",
    "handles_offloaded",
    "summary",
    "read_tool_output",
    "checkpoint",
    "checkpoint_dropped",
}


def test_figure_5_event_holds_every_mechanism_and_the_summary() -> None:
    event = event_for(IMPROVED, figure_5(), 15_000, safeguard=True)
    assert set(event) >= REQUIRED and event["schema_version"] == SCHEMA_VERSION
    assert {"retry_collapse", "offload", "summarize", "verify_guidance"} <= set(event["mechanisms"])
    assert event["trigger"] == "threshold" and event["threshold"] == 12_000 and event["window"] == 15_000
    assert event["parent_range"]["messages"][0] == 2 and len(event["parent_range"]["digest"]) == 32
    assert event["summary"]["model"] == "ledger" and event["summary"]["fallback_reason"] is None
    assert len(event["summary"]["hash"]) == 32
    assert event["handles_offloaded"] and event["tokens_after"] < event["tokens_before"]
    assert event["details"]["retry_collapse"]["chains"] == 1


@pytest.mark.parametrize(
    ("stages", "mechanism"),
    [
        ([{"n_latest": {"n": 4}}], "n_latest"),
        ([{"micro_compact": {"min_chars": 10}}], "micro_compact"),
        ([{"auto_compact": {"trigger": 0.1}}], "auto_compact"),
        ([{"token_safeguard": {"max_share": 0.5, "reserve_tokens": 0}}], "token_safeguard"),
    ],
)
def test_single_mechanism_events(stages: list[Any], mechanism: str) -> None:
    messages: list[Any] = [SYSTEM, {"role": "user", "content": "turn one"}]
    for i in range(7):
        messages += step(f"c{i}", f"cmd {i}", words(150, f"x{i}"))
    messages += [{"role": "user", "content": "turn two"}, *step("d", "ls", "ok")]
    event = event_for(stages, messages, 4_000)
    assert mechanism in event["mechanisms"]
    assert event["messages_after"] < event["messages_before"] or mechanism == "micro_compact"
    if mechanism == "auto_compact":
        assert event["summary"] is not None and event["parent_range"]["messages"] == [1, 16]
    else:
        assert event["summary"] is None


def test_unchanged_request_event_is_light_but_complete() -> None:
    event = event_for([{"n_latest": {"n": 50}}], [SYSTEM, TASK], 128_000)
    assert event["mechanisms"] == [] and event["trigger"] is None
    assert event["tokens_before"] == event["tokens_after"] and event["messages_after"] == 2


def test_event_ids_sort_in_the_order_they_were_made() -> None:
    """A store appends each new id to its index (no random page per event), and ids made in
    one microsecond still differ."""
    ids = [new_event_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids) and all(i.startswith("ev_") and len(i) == 29 for i in ids)
    stamps = [int(i[3:17], 16) for i in ids]
    assert stamps == sorted(stamps)


def test_a_sessions_checkpoint_json_is_encoded_once_per_change_and_exact_for_every_request() -> None:
    json = CheckpointJson(sessions=2)
    summary = {"role": "user", "content": 'a summary that quotes "requests":5 and -739201557'}
    placeholders = {"3:ab": {"role": "tool", "content": "x"}}
    checkpoint = Checkpoint(summary=summary, covered=4, placeholders=placeholders)
    encodes: list[object] = []
    for number in range(1, 6):
        current = replace(checkpoint, requests=number)
        assert json.encode("s", current) == encode_checkpoint(current)
        encodes.append(json._templates["s"][1])
    assert all(e is encodes[0] for e in encodes)  # encoded once while only the counter changed
    changed = replace(checkpoint, covered=6, requests=9)
    assert json.encode("s", changed) == encode_checkpoint(changed)
    for session in ("t", "u"):  # the oldest session is forgotten past the bound
        assert json.encode(session, changed) == encode_checkpoint(changed)
    assert list(json._templates) == ["t", "u"]
