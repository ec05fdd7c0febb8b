"""Transcripts: each summary saves the messages it replaces, verbatim, under one handle the
ledger names (a small tool output folded into the summary can be read back word for word);
saved before any view names it, re-applied byte for byte between compaction points, chained
across repeated compactions without saving a message twice; off, nothing is saved."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from typing import Any

import orjson

from policies.conversation import message_text
from policies.handles import PATTERN, PLACEHOLDER_PREFIX
from policies.ledger_records import TranscriptRecord, render_transcripts
from policies.pipeline import Checkpoint, Offload, PolicyOutcome, build_policy
from policies.tokens import TokenCounter
from policies.transcript import TRANSCRIPT_HEADER, build_transcript
from proxy.state.store import decode_checkpoint, encode_checkpoint

COUNTER = TokenCounter()
WINDOW = 8_000
SYSTEM = {"role": "system", "content": "You are a coding agent."}
TASK = {"role": "user", "content": "Make the checksum tool report the right digest."}
SECTION = "### Transcripts: the summarized messages, verbatim, oldest first"


def stages(summarize: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return [
        {"trigger": {"high": 0.8}},
        {"retry_collapse": {}},
        {"offload": {}},
        {"summarize": {"target": 0.5, "retained_tail": 0.2, **(summarize or {})}},
        {"verify_guidance": {}},
    ]


IMPROVED = build_policy("improved", "", stages())
WITHOUT = build_policy("without", "", stages({"save_transcript": False}))


def small_output(tag: str) -> str:
    """What a script printed: a few lines, the last one distinctive (no ledger keeps it)."""
    return f"loading inputs for {tag}\nchecksum of {tag}: 9f{tag}c0de\n[exit code 0]"


def step(tag: str, output: str | None = None, filler: int = 60) -> list[dict[str, Any]]:
    note = " ".join(f"{tag}-note-{i}" for i in range(filler))
    return [
        {
            "role": "assistant",
            "content": f"Running the checksum for {tag}. {note}",
            "tool_calls": [
                {
                    "id": f"call_{tag}",
                    "type": "function",
                    "function": {
                        "name": "execute_bash",
                        "arguments": json.dumps({"command": f"python checksum.py --input {tag}.txt"}),
                    },
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": f"call_{tag}",
            "name": "execute_bash",
            "content": output if output is not None else small_output(tag),
        },
    ]


def apply(policy: Any, messages: list[Any], checkpoint: Checkpoint | None = None) -> PolicyOutcome:
    outcome: PolicyOutcome = asyncio.run(
        policy.apply({"model": "gpt-4o", "messages": messages}, COUNTER, window=WINDOW, checkpoint=checkpoint)
    )
    return outcome


def view_of(outcome: PolicyOutcome, messages: list[Any]) -> list[Any]:
    return outcome.messages if outcome.messages is not None else messages


def summary_of(view: list[Any]) -> str:
    return next(message_text(m) for m in view if message_text(m).startswith("[Summary"))


def transcript_handles(summary: str) -> list[str]:
    section = summary.split(SECTION, 1)[1].split("\n### ", 1)[0]
    return PATTERN.findall(section)


def transcripts(offloads: dict[str, Offload]) -> dict[str, Offload]:
    return {h: o for h, o in offloads.items() if o.description.startswith("transcript:")}


def session(tags: list[str]) -> list[Any]:
    return [SYSTEM, TASK, *(m for tag in tags for m in step(tag))]


def test_a_small_output_folded_into_the_summary_is_in_the_transcript_verbatim() -> None:
    history = session([f"s{i}" for i in range(20)])
    outcome = apply(IMPROVED, history)
    view = view_of(outcome, history)
    summary = summary_of(view)
    assert outcome.checkpoint.summary is not None
    covered = range(outcome.checkpoint.summary_at, outcome.checkpoint.summary_at + outcome.checkpoint.covered)
    view_text = orjson.dumps(view).decode()
    folded = [history[i] for i in covered if history[i]["role"] == "tool"]
    assert folded, "the summary covers some outputs"
    last_lines = [message_text(m).splitlines()[1] for m in folded]
    assert not any(line in view_text for line in last_lines), "the ledger does not keep these lines"
    # One transcript, named in the summary, saved in this very outcome.
    (handle,) = transcript_handles(summary)
    saved = outcome.offloads[handle]
    assert handle in outcome.checkpoint.handles
    assert saved.content.startswith(TRANSCRIPT_HEADER)
    assert saved.description.startswith(f"transcript: client messages {covered[0]}-{covered[-1]} verbatim")
    # Every covered message verbatim and in order: role, call and its arguments, the whole output.
    positions = []
    for index in covered:
        message = history[index]
        if message["role"] == "tool":
            header = f"=== message {index} | tool result for {message['tool_call_id']} (execute_bash) ==="
            body = message["content"]
        else:
            header = f"=== message {index} | assistant ==="
            body = message["content"] + f"\n--- call {message['tool_calls'][0]['id']} ---\nexecute_bash("
        positions.append(saved.content.index(f"{header}\n{body}"))
    assert positions == sorted(positions)
    assert "command=python checksum.py --input s0.txt" in saved.content
    # Not summarized, not saved: the task and the retained tail stay out of the transcript.
    assert TASK["content"] not in saved.content
    assert message_text(history[-1]) not in saved.content


def test_the_transcript_is_named_with_how_to_read_it_and_listed_apart_from_saved_outputs() -> None:
    history = session([f"n{i}" for i in range(20)])
    outcome = apply(IMPROVED, history)
    summary = summary_of(view_of(outcome, history))
    (handle,) = transcript_handles(summary)
    line = next(line for line in summary.splitlines() if line.startswith(SECTION))
    assert "read_tool_output" in line and "pattern=" in line and "start_line/num_lines" in line
    saved_section = (
        summary.split("### Saved outputs", 1)[1].split("\n### ", 1)[0] if "### Saved" in summary else ""
    )
    assert handle not in saved_section


def test_every_handle_a_view_names_is_saved_at_or_before_that_request_and_reapplied_byte_for_byte() -> None:
    history = session([f"b{i}" for i in range(20)])
    first = apply(IMPROVED, history)
    assert transcripts(dict(first.offloads)), "the compaction point saves a transcript"
    previous = view_of(first, history)
    checkpoint = first.checkpoint
    saved = set(first.offloads)
    for i in range(3):
        history = [*history, *step(f"later{i}", filler=5)]
        outcome = apply(IMPROVED, history, checkpoint)
        view = view_of(outcome, history)
        assert outcome.trigger is None
        assert orjson.dumps(view[: len(previous)]) == orjson.dumps(previous)
        assert not transcripts(dict(outcome.offloads)), "decided once, at the compaction point"
        saved |= set(outcome.offloads)
        assert set(PATTERN.findall(orjson.dumps(view).decode())) <= saved
        previous, checkpoint = view, outcome.checkpoint


def test_the_checkpoint_with_transcripts_survives_the_store_encoding() -> None:
    history = session([f"e{i}" for i in range(20)])
    checkpoint = apply(IMPROVED, history).checkpoint
    assert checkpoint.ledger is not None and checkpoint.ledger.transcripts
    assert decode_checkpoint(encode_checkpoint(checkpoint)) == checkpoint


def test_repeated_compactions_chain_transcripts_without_saving_a_message_twice() -> None:
    history = [SYSTEM, TASK]
    checkpoint: Checkpoint | None = None
    saved: dict[str, Offload] = {}
    tags: list[str] = []
    for cycle in range(60):
        tag = f"r{cycle}"
        tags.append(tag)
        history = [*history, *step(tag)]
        outcome = apply(IMPROVED, history, checkpoint)
        view = view_of(outcome, history)
        saved.update(outcome.offloads)
        named = set(PATTERN.findall(orjson.dumps(view).decode()))
        assert named <= set(saved), "named before saved"
        checkpoint = outcome.checkpoint
    assert checkpoint is not None and checkpoint.ledger is not None
    records = checkpoint.ledger.transcripts
    assert len(records) >= 3, "several compactions"
    summary = summary_of(view)
    # Every transcript is listed, oldest first, in the ledger the model sees.
    assert transcript_handles(summary) == [r.handle for r in records]
    # Consecutive, non-overlapping ranges; each transcript names the one before it.
    for before, after in itertools.pairwise(records):
        assert after.first == before.last + 1
        assert f"previous transcript: handle={before.handle}" in saved[after.handle].content
        assert TRANSCRIPT_HEADER not in saved[after.handle].content.split("\n", 1)[1]
    # Each summarized output is in exactly one transcript: nothing is re-embedded.
    texts = [saved[r.handle].content for r in records]
    for tag in tags:
        index = next(i for i, m in enumerate(history) if m.get("tool_call_id") == f"call_{tag}")
        summarized = any(r.first <= index <= r.last for r in records)
        holders = [t for t in texts if f"checksum of {tag}: 9f{tag}c0de" in t]
        assert len(holders) == summarized, tag


def test_an_offloaded_output_stays_a_placeholder_in_the_transcript() -> None:
    big = "\n".join(f"row {i}: " + "value " * 12 for i in range(400)) + "\n[exit code 0]"
    history = [SYSTEM, TASK, *step("big", big), *session([f"p{i}" for i in range(20)])[2:]]
    outcome = apply(IMPROVED, history)
    summary = summary_of(view_of(outcome, history))
    (handle,) = transcript_handles(summary)
    content = outcome.offloads[handle].content
    assert big not in content and "row 17: " not in content
    # The output was offloaded at this compaction point: the transcript keeps its placeholder,
    # whose handle holds the output itself.
    result = content.split("=== message 3 | tool result for call_big (execute_bash) ===\n", 1)[1]
    assert result.startswith(PLACEHOLDER_PREFIX)
    (saved_big,) = set(PATTERN.findall(result.split("\n===", 1)[0]))
    assert outcome.offloads[saved_big].content == big
    assert saved_big in summary  # and the ledger names it


def test_the_token_safeguard_fold_saves_a_transcript_too() -> None:
    history = session([f"f{i}" for i in range(3)])
    history += step("huge1", filler=900) + step("huge2", filler=900)
    history.append({"role": "user", "content": "What changed?"})
    outcome = asyncio.run(
        build_policy("s", "", [{"summarize": {}}]).apply(
            {"model": "gpt-4o", "messages": history}, COUNTER, window=WINDOW
        )
    )
    fact = outcome.facts.token_safeguard
    assert fact is not None and fact.summarized_messages > 0
    (handle,) = transcript_handles(summary_of(view_of(outcome, history)))
    assert "checksum of f0: 9ff0c0de" in outcome.offloads[handle].content


def test_knob_off_saves_no_transcript() -> None:
    history = session([f"o{i}" for i in range(20)])
    outcome = apply(WITHOUT, history)
    summary = summary_of(view_of(outcome, history))
    assert SECTION not in summary
    assert not transcripts(dict(outcome.offloads))
    assert outcome.checkpoint.ledger is not None and not outcome.checkpoint.ledger.transcripts


def test_auto_compact_saves_a_transcript_only_with_its_knob() -> None:
    history = [SYSTEM, TASK, *session([f"a{i}" for i in range(20)])[2:]]
    history.append({"role": "user", "content": "Now also update the README."})
    for knob, expected in ((False, 0), (True, 1)):
        policy = build_policy("sre", "", [{"auto_compact": {"trigger": 0.5, "save_transcript": knob}}])
        outcome = apply(policy, history)
        assert outcome.checkpoint.summary is not None
        assert len(transcripts(dict(outcome.offloads))) == expected


def test_the_transcript_renders_calls_readably_and_is_deterministic() -> None:
    messages: list[Any] = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {
                        "name": "str_replace_editor",
                        "arguments": json.dumps(
                            {
                                "command": "str_replace",
                                "path": "/r/a.py",
                                "old_str": "x = 1",
                                "new_str": "x = 2\ny = 3",
                            }
                        ),
                    },
                },
                {"id": "c2", "type": "function", "function": {"name": "odd", "arguments": "not json"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "edited"},
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "parts\nkept"}]},
    ]
    one = build_transcript(messages, [5, 6, 7], earlier="out_0123456789abcdef")
    again = build_transcript(messages, [5, 6, 7], earlier="out_0123456789abcdef")
    assert one is not None and again is not None and one == again
    assert one.record.first == 5 and one.record.last == 7 and one.record.messages == 3
    assert (
        "str_replace_editor(command=str_replace, path=/r/a.py, old_str=x = 1)\n--- new_str ---\nx = 2\ny = 3"
        in (one.text)
    )
    assert "--- call c2 ---\nodd(not json)" in one.text
    assert "=== message 7 | tool result for c2 ===\nparts\nkept" in one.text
    assert "previous transcript: handle=out_0123456789abcdef" in one.text
    assert build_transcript([], []) is None


def test_the_ledger_lists_the_oldest_and_newest_transcripts_when_there_are_very_many() -> None:
    records = [TranscriptRecord(f"out_{i:016x}", i * 10, i * 10 + 9, 10, 3, 1000) for i in range(130)]
    lines = render_transcripts(records)
    handles = [h for line in lines for h in PATTERN.findall(line)]
    assert handles[0] == records[0].handle and handles[-1] == records[-1].handle
    assert len(handles) == 100 and any(re.search(r"\.\.\. 30 more", line) for line in lines)


def test_a_call_holding_an_integer_past_64_bits_is_written_into_the_transcript() -> None:
    # A body only Python's lenient parser reads keeps such integers; a transcript (and the
    # readable call text) must still be written, as Python's JSON writes them.
    big = 2**70
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": {"n": big}}},
        {"id": "c2", "type": "function", "function": {"name": "bash", "arguments": [big]}},
        {"id": "c3", "type": "weird", "value": big},
    ]
    messages = [
        {"role": "user", "content": "Go."},
        {"role": "assistant", "content": None, "tool_calls": calls},
    ]
    transcript = build_transcript(messages, [0, 1])
    assert transcript is not None
    assert transcript.text.count(str(big)) == 3
