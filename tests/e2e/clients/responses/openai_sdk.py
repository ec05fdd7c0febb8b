"""The ``openai`` SDK on the Responses API, a loop driven here: ``responses.create`` (JSON),
``responses.create(stream=True)`` (its raw events checked for a well-formed stream) or the SDK's
own ``responses.stream()`` helper (which refuses an inconsistent stream)."""

from __future__ import annotations

from typing import Any

import orjson

from tests.e2e.clients.responses import (
    API_KEY,
    CLIENT_TIMEOUT,
    INSTRUCTIONS,
    MODEL,
    TOOL_DESCRIPTION,
    TOOL_NAME,
    ClientRun,
    StreamFailed,
)
from tests.responses_upstream import step_output


def tool_schema() -> dict[str, Any]:
    return {
        "type": "function",
        "name": TOOL_NAME,
        "description": TOOL_DESCRIPTION,
        "parameters": {
            "type": "object",
            "properties": {"step": {"type": "integer", "description": "The check's number."}},
            "required": ["step"],
            "additionalProperties": False,
        },
        "strict": True,
    }


def stream_problems(events: list[dict[str, Any]]) -> list[str]:
    """What makes a Responses event stream ill-formed for a client: sequence numbers not counting
    up from 0, not exactly one ``response.created`` first and one ``response.completed`` last, an
    item event before its ``output_item.added`` or after its ``output_item.done``, output indexes
    not assigned in order, or a completed ``output`` that differs from the items streamed."""
    problems: list[str] = []
    numbers = [e.get("sequence_number") for e in events]
    if numbers != list(range(len(events))):
        problems.append(f"sequence_number is not 0..{len(events) - 1}: {numbers}")
    kinds = [e.get("type") for e in events]
    ids = {
        str(e.get("type")): (e.get("response") or {}).get("id")
        for e in events
        if e.get("type") in ("response.created", "response.in_progress", "response.completed")
    }
    if len(set(ids.values())) > 1:
        problems.append(f"the response changed its id during the stream: {ids}")
    if kinds[:1] != ["response.created"] or kinds.count("response.created") != 1:
        problems.append(f"response.created is not first and alone: {kinds[:3]}")
    if kinds.count("response.completed") != 1 or kinds[-1] != "response.completed":
        problems.append(f"response.completed is not last and alone (last: {kinds[-1:]})")
    open_items: dict[int, str] = {}
    done: dict[int, Any] = {}
    for position, event in enumerate(events):
        index = event.get("output_index")
        kind = str(event.get("type"))
        if not isinstance(index, int):
            continue
        if kind == "response.output_item.added":
            expected = len(done) + len(open_items)
            if index != expected or index in done:
                problems.append(f"event {position}: item added at output_index {index}, expected {expected}")
            open_items[index] = str((event.get("item") or {}).get("id"))
        elif index not in open_items:
            problems.append(f"event {position}: {kind} for output_index {index}, which is not open")
        elif kind == "response.output_item.done":
            done[index] = event.get("item")
            del open_items[index]
        elif event.get("item_id") not in (None, open_items[index]):
            problems.append(f"event {position}: {kind} names item {event.get('item_id')!r}")
    if open_items:
        problems.append(f"items never done: {sorted(open_items)}")
    completed = next((e for e in reversed(events) if e.get("type") == "response.completed"), None)
    if completed is not None:
        output = (completed.get("response") or {}).get("output")
        streamed = [done[i] for i in sorted(done)]
        if output != streamed:
            listed = [(i or {}).get("type") for i in output or []]
            problems.append(
                f"response.completed lists {len(listed)} item(s), not the {len(streamed)} streamed: "
                f"{listed} vs {[(i or {}).get('type') for i in streamed]}"
            )
        usage = (completed.get("response") or {}).get("usage")
        if not isinstance(usage, dict) or not all(
            isinstance(usage.get(k), int) for k in ("input_tokens", "output_tokens", "total_tokens")
        ):
            problems.append(f"response.completed has no usage: {usage!r}")
    return problems


def _run_tool(item: dict[str, Any], ran: list[int]) -> str:
    step = int(orjson.loads(item["arguments"])["step"])
    ran.append(step)
    return step_output(step)


def run(
    base_url: str, task: str, *, stream: bool, headers: dict[str, str], max_turns: int, helper: bool = False
) -> ClientRun:
    """Codex's way: ``store: false``, every turn's output items and the tool outputs appended to
    ``input`` (the reasoning items with their ``encrypted_content``, as received). ``stream``:
    ``responses.create(stream=True)``, its raw events checked here; ``helper``: the SDK's own
    ``responses.stream()`` helper, which builds the response from the events and refuses an
    inconsistent stream."""
    import openai

    # Typed loosely: the input items are plain JSON, as a client that stores them would keep them.
    client: Any = openai.OpenAI(base_url=base_url, api_key=API_KEY, max_retries=0, timeout=CLIENT_TIMEOUT / 2)
    history: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": task}]
    ran: list[int] = []
    problems: list[str] = []
    kinds: set[str] = set()
    options: dict[str, Any] = {
        "model": MODEL,
        "instructions": INSTRUCTIONS,
        "tools": [tool_schema()],
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "extra_headers": headers,
    }
    try:
        for _turn in range(max_turns):
            if helper:
                with client.responses.stream(input=history, **options) as helper_stream:
                    for event in helper_stream:
                        kinds.add(event.type)
                        if event.type in ("error", "response.failed"):
                            raise StreamFailed(f"the stream ended with {event.to_dict()}", event)
                    final_response = helper_stream.get_final_response()
                output = [item.to_dict() for item in final_response.output]
            elif stream:
                events = []
                with client.responses.create(input=history, stream=True, **options) as response_stream:
                    for event in response_stream:
                        payload = event.to_dict()
                        events.append(payload)
                        if payload.get("type") in ("error", "response.failed"):
                            raise StreamFailed(f"the stream ended with {payload}", payload)
                kinds.update(str(e.get("type")) for e in events)
                completed = next((e for e in events if e.get("type") == "response.completed"), None)
                if completed is None:
                    raise StreamFailed(
                        f"the stream ended without response.completed after {len(events)} events"
                    )
                problems += [f"turn {_turn}: {p}" for p in stream_problems(events)]
                output = completed["response"]["output"]
            else:
                response = client.responses.create(input=history, **options)
                output = [item.to_dict() for item in response.output]
            history += output
            calls = [i for i in output if i.get("type") == "function_call"]
            if not calls:
                # The last message is the answer (a read answer's text may come before it).
                messages = [i for i in output if i.get("type") == "message"]
                final = (
                    "".join(p.get("text", "") for p in messages[-1].get("content") or []) if messages else ""
                )
                return ClientRun(final, ran, history, problems, {"event_types": sorted(kinds)})
            for call in calls:
                history.append(
                    {
                        "type": "function_call_output",
                        "call_id": call["call_id"],
                        "output": _run_tool(call, ran),
                    }
                )
    finally:
        client.close()
    raise AssertionError(f"no final answer after {max_turns} turns")
