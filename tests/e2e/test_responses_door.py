"""The Responses API door, end to end with the official openai SDK: compacted like chat
(non-stream and stream, read_tool_output answered inside the proxy), history held upstream
passed through and said so, the agent's own compaction recognized, other routes verbatim."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import httpx
import openai
import pytest

from tests.fake_upstream import FakeUpstream, Recorded, Reply

pytestmark = pytest.mark.e2e

CONFIG = {"policy": "improved", "context_windows": {"default": 8000}}
KEY = "sk-responses-door-0000000000"
HANDLE = re.compile(r"handle=(out_[0-9a-f]{16})")


def response(output: list[dict[str, Any]], *, usage: int = 10) -> dict[str, Any]:
    return {
        "id": "resp_fake",
        "object": "response",
        "created_at": 1_700_000_000,
        "status": "completed",
        "model": "gpt-5",
        "output": output,
        "usage": {"input_tokens": usage, "output_tokens": 2, "total_tokens": usage + 2},
    }


def message(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def history(steps: int = 10) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "You are Codex."}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the parser."}]},
    ]
    for i in range(steps):
        lines = [f"file {i} line {n}: " + "token " * 8 for n in range(80)]
        if i == 0:
            lines[41] = "SECRET-LINE value=4242"
        items += [
            {"type": "reasoning", "id": f"rs_{i}", "summary": [], "encrypted_content": f"gAAAAB-{i}"},
            {
                "type": "function_call",
                "id": f"fc_{i}",
                "call_id": f"call_{i}",
                "name": "exec_command",
                "arguments": json.dumps({"cmd": f"cat f{i}.py"}),
            },
            {"type": "function_call_output", "call_id": f"call_{i}", "output": "\n".join(lines)},
        ]
    return items


def sdk(proxy: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0)


def reads_first_handle(request: Recorded) -> Reply:
    handle = HANDLE.findall(request.body.decode())[0]
    call = {
        "type": "function_call",
        "id": "fc_read",
        "call_id": "call_read",
        "name": "read_tool_output",
        "arguments": json.dumps({"handle": handle, "pattern": "SECRET"}),
        "status": "completed",
    }
    reasoning = {"type": "reasoning", "id": "rs_read", "summary": [], "encrypted_content": "gAAAAB-read"}
    return Reply(body=response([reasoning, call]))


def test_a_long_history_is_compacted_and_reads_are_answered(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy(CONFIG)
    upstream.queue(
        Reply(dynamic=reads_first_handle), Reply(body=response([message("value is 4242")], usage=20))
    )
    raw = sdk(proxy).responses.with_raw_response.create(model="gpt-5", input=history(), store=False)  # type: ignore[arg-type]
    answer = raw.parse()
    assert answer.output_text == "value is 4242"
    assert answer.usage is not None and answer.usage.input_tokens == 20  # the last round's prompt
    assert (
        raw.headers["x-compaction-trigger"] == "threshold" and raw.headers["x-compaction-read-rounds"] == "1"
    )
    first, second = upstream.requests
    sent = first.json()
    assert int(raw.headers["x-compaction-tokens-after"]) < int(raw.headers["x-compaction-tokens-before"])
    assert [t["name"] for t in sent["tools"]] == ["read_tool_output"]
    # Reasoning items reach the upstream exactly as the client sent them.
    reasoning = {i["id"]: i for i in sent["input"] if i["type"] == "reasoning"}
    assert all(item["encrypted_content"] == f"gAAAAB-{item['id'][3:]}" for item in reasoning.values())
    follow_up = second.json()["input"]
    assert [i["type"] for i in follow_up[-3:]] == ["reasoning", "function_call", "function_call_output"]
    assert "SECRET-LINE value=4242" in follow_up[-1]["output"]


def stream_of(items: list[dict[str, Any]], usage: int) -> list[bytes]:
    def event(payload: dict[str, Any]) -> bytes:
        return f"event: {payload['type']}\ndata: {json.dumps(payload)}\n\n".encode()

    events = [
        event({"type": "response.created", "sequence_number": 0, "response": {"id": "resp_s", "output": []}}),
        event({"type": "response.in_progress", "sequence_number": 1, "response": {"id": "resp_s"}}),
    ]
    for index, item in enumerate(items):
        events.append(event({"type": "response.output_item.added", "output_index": index, "item": item}))
        if item["type"] == "message":
            for word in item["content"][0]["text"].split(" "):
                events.append(
                    event(
                        {
                            "type": "response.output_text.delta",
                            "output_index": index,
                            "item_id": item["id"],
                            "content_index": 0,
                            "delta": word + " ",
                        }
                    )
                )
        events.append(event({"type": "response.output_item.done", "output_index": index, "item": item}))
    done = {"input_tokens": usage, "output_tokens": 3, "total_tokens": usage + 3}
    events.append(
        event({"type": "response.completed", "response": response(items, usage=usage) | {"usage": done}})
    )
    return events


def test_a_stream_over_two_rounds_is_one_well_formed_stream(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy(CONFIG)

    def streamed_read(request: Recorded) -> Reply:
        reply = reads_first_handle(request)
        return Reply(kind="sse", chunks=stream_of(reply.body["output"], 100), done=False)

    final = [message("found value 4242")]
    upstream.queue(Reply(dynamic=streamed_read), Reply(kind="sse", chunks=stream_of(final, 50), done=False))
    events = list(sdk(proxy).responses.create(model="gpt-5", input=history(), stream=True))  # type: ignore[arg-type]
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds.count("response.created") == 1
    assert kinds[-1] == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text.strip() == "found value 4242"
    completed = events[-1].response
    assert [item.type for item in completed.output] == ["message"]
    assert completed.usage is not None and completed.usage.input_tokens == 50
    assert completed.usage.output_tokens == 6  # both rounds'
    assert [e.sequence_number for e in events] == list(range(len(events)))
    # One response: the completion carries the id the stream started with (the SDK's stream
    # helper refuses a response whose identity changes).
    assert completed.id == events[0].response.id == "resp_s"
    # The read went back upstream with its reasoning and its call, as the API requires.
    follow_up = upstream.requests[1].json()["input"]
    assert [i["type"] for i in follow_up[-3:]] == ["reasoning", "function_call", "function_call_output"]
    assert follow_up[-2]["call_id"] == follow_up[-1]["call_id"] == "call_read"
    assert follow_up[-3]["encrypted_content"] == "gAAAAB-read"


def test_a_streamed_round_that_reads_sends_none_of_its_items_to_the_client(
    start_proxy: Any, upstream: FakeUpstream
) -> None:
    """Reasoning, an agent's call and a read in one round: the round is asked again, so neither
    the call nor the reasoning before it reaches the client (its history would hold a reasoning
    item without the item that followed it)."""
    proxy = start_proxy(CONFIG)

    def mixed(request: Recorded) -> Reply:
        read = reads_first_handle(request).body["output"]
        agent_call = {
            "type": "function_call",
            "id": "fc_agent",
            "call_id": "call_agent",
            "name": "exec_command",
            "arguments": json.dumps({"cmd": "ls"}),
            "status": "completed",
        }
        reasoning = {"type": "reasoning", "id": "rs_agent", "summary": [], "encrypted_content": "gAAAAB-a"}
        return Reply(kind="sse", chunks=stream_of([reasoning, agent_call, *read], 100), done=False)

    final = [
        {"type": "reasoning", "id": "rs_final", "summary": [], "encrypted_content": "gAAAAB-f"},
        {
            "type": "function_call",
            "id": "fc_final",
            "call_id": "call_final",
            "name": "exec_command",
            "arguments": json.dumps({"cmd": "grep -n 4242 f0.py"}),
            "status": "completed",
        },
    ]
    upstream.queue(Reply(dynamic=mixed), Reply(kind="sse", chunks=stream_of(final, 50), done=False))
    events = list(sdk(proxy).responses.create(model="gpt-5", input=history(), stream=True))  # type: ignore[arg-type]
    added = [e.item.id for e in events if e.type == "response.output_item.added"]
    assert added == ["rs_final", "fc_final"]
    assert [item.id for item in events[-1].response.output] == ["rs_final", "fc_final"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "read_tool_output" not in json.dumps([e.model_dump() for e in events])


def test_a_failed_round_after_the_stream_started_is_an_error(
    start_proxy: Any, upstream: FakeUpstream
) -> None:
    proxy = start_proxy(CONFIG)
    # Longer than the first characters of a round the proxy holds (HELD_TEXT_CHARS): the
    # stream has started with it when the read round fails.
    long_text = " ".join(f"Let me look at part {n} of the saved output." for n in range(14))

    def text_then_read(request: Recorded) -> Reply:
        read = reads_first_handle(request).body["output"]
        return Reply(kind="sse", chunks=stream_of([message(long_text), *read], 100), done=False)

    failure = Reply(status=500, body={"error": {"message": "boom", "type": "server_error", "code": None}})
    upstream.queue(Reply(dynamic=text_then_read), failure)
    stream = sdk(proxy).responses.create(model="gpt-5", input=history(), stream=True)  # type: ignore[arg-type]
    events = list(stream)
    # The text so far, then the Responses API's error event and the response failed (with the
    # id the client has been receiving); never a completed response.
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta").strip() == long_text
    error, failed = events[-2:]
    assert error.type == "error" and "HTTP 500" in error.message
    assert failed.type == "response.failed" and failed.response.status == "failed"
    assert failed.response.id == events[0].response.id
    assert failed.response.error is not None and "HTTP 500" in failed.response.error.message
    assert "response.completed" not in [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_a_read_rounds_short_preamble_reaches_the_client_neither_streamed_nor_not(
    start_proxy: Any, upstream: FakeUpstream
) -> None:
    """Text the model writes before a read call ("Let me look.") is dropped the same streamed
    and not: structured-output clients parse the final text, and a failure of the next round
    comes before any byte, with the upstream's own status."""
    proxy = start_proxy(CONFIG)

    def text_then_read(request: Recorded) -> Reply:
        read = reads_first_handle(request).body["output"]
        return Reply(kind="sse", chunks=stream_of([message("Let me look."), *read], 100))

    def final(_request: Recorded) -> Reply:
        return Reply(kind="sse", chunks=stream_of([message("value is 4242")], 120))

    upstream.queue(Reply(dynamic=text_then_read), Reply(dynamic=final))
    stream = sdk(proxy).responses.create(model="gpt-5", input=history(), stream=True)  # type: ignore[arg-type]
    events = list(stream)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text.strip() == "value is 4242"
    completed = events[-1]
    assert completed.type == "response.completed"
    assert [i.type for i in completed.response.output] == ["message"]
    assert [e.sequence_number for e in events] == list(range(len(events)))

    failure = Reply(status=500, body={"error": {"message": "boom", "type": "server_error", "code": None}})
    upstream.queue(Reply(dynamic=text_then_read), failure)
    with pytest.raises(openai.InternalServerError):
        list(sdk(proxy).responses.create(model="gpt-5", input=history(), stream=True))  # type: ignore[arg-type]


def test_history_held_upstream_goes_as_sent(start_proxy: Any, upstream: FakeUpstream) -> None:
    proxy = start_proxy(CONFIG)
    upstream.queue(Reply(body=response([message("ok")])))
    body = {"model": "gpt-5", "input": history(), "previous_response_id": "resp_earlier"}
    answer = httpx.post(proxy.base_url + "/responses", json=body, headers={"authorization": f"Bearer {KEY}"})
    assert answer.status_code == 200
    assert answer.headers["x-compaction-skipped"] == "previous_response_id: the history is held upstream"
    assert upstream.requests[-1].json() == body


def test_the_agents_own_compaction_request_goes_as_sent_and_is_recorded(
    start_proxy: Any, upstream: FakeUpstream
) -> None:
    # 13,040 tokens: over the compaction threshold (0.8 x 15,500), within the window.
    proxy = start_proxy({**CONFIG, "context_windows": {"default": 15_500}})
    upstream.queue(Reply(body=response([message("summary of the work")])))
    items = [
        *history(),
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Summarize."}]},
    ]
    headers = {
        "authorization": f"Bearer {KEY}",
        "x-codex-turn-metadata": json.dumps({"request_kind": "compaction", "turn_id": "t1"}),
    }
    answer = httpx.post(
        proxy.base_url + "/responses", json={"model": "gpt-5", "input": items, "tools": []}, headers=headers
    )
    assert answer.status_code == 200
    assert answer.headers["x-compaction-skipped"] == "codex's own compaction request"
    assert upstream.requests[-1].json()["input"] == items
    time.sleep(0.3)
    events = httpx.get(
        proxy.base_url + "/compaction/events", headers={"authorization": f"Bearer {KEY}"}
    ).json()["data"]
    assert events[-1]["dialect"] == "responses"
    assert events[-1]["dialect_notes"]["agent_compaction"] == {
        "agent": "codex",
        "action": "forwarded as sent",
    }


def test_other_responses_routes_are_verbatim(proxy: Any, upstream: FakeUpstream) -> None:
    headers = {"authorization": f"Bearer {KEY}"}
    got = httpx.get(proxy.base_url + "/responses/resp_123?include=x", headers=headers)
    assert got.json()["echo"] == {"method": "GET", "path": "/v1/responses/resp_123", "query": "include=x"}
    # `/v1/responses/compact` is answered by the proxy here (test_responses_compact.py).


def stored_history(steps: int = 24) -> list[dict[str, Any]]:
    """What the Vercel AI SDK sends with ``store: true``: earlier reasoning and assistant text
    as ``item_reference`` items, the function calls and their outputs as items."""
    items: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": [{"type": "input_text", "text": "Fix the parser."}]},
    ]
    for i in range(steps):
        lines = [f"file {i} line {n}: " + "token " * 8 for n in range(60)]
        items += [
            {"type": "item_reference", "id": f"rs_{i:04d}"},
            # Text before the call on every other step (a tool loop's usual turn has none).
            *([{"type": "item_reference", "id": f"msg_{i:04d}"}] if i % 2 else []),
            {
                "type": "function_call",
                "call_id": f"call_{i}",
                "name": "exec_command",
                "arguments": json.dumps({"cmd": f"cat f{i}.py"}),
                "id": f"fc_{i:04d}",
            },
            {"type": "function_call_output", "call_id": f"call_{i}", "output": "\n".join(lines)},
        ]
    return items


def test_stored_item_references_go_with_their_turn(start_proxy: Any, upstream: FakeUpstream) -> None:
    """A reference to a reasoning item is only valid followed by the rest of its turn (OpenAI
    refuses "Item 'rs_...' of type 'reasoning' was provided without its required following
    item"): after a summary no reference is left whose turn was summarized away."""
    from tests.responses_upstream.checks import protocol_problems

    proxy = start_proxy({"policy": "improved", "context_windows": {"default": 6000}})
    upstream.queue(Reply(body=response([message("done")])))
    sent_items = stored_history()
    answer = httpx.post(
        f"{proxy.base_url}/responses",
        json={"model": "gpt-5", "input": sent_items, "store": True},
        headers={"authorization": f"Bearer {KEY}"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-compaction-trigger"] == "threshold"
    received = upstream.requests[0].json()["input"]
    assert protocol_problems(received) == []
    references = [i["id"] for i in received if i.get("type") == "item_reference"]
    assert 0 < len(references) < 36  # some turns summarized, each kept whole
    for position, item in enumerate(received):
        if item.get("type") == "item_reference" and item["id"].startswith("rs_"):
            step = int(item["id"][3:])
            after = received[position + 1 : position + 3 if step % 2 else position + 2]
            assert after[-1]["id"] == f"fc_{step:04d}"
    events = httpx.get(
        proxy.base_url + "/compaction/events", headers={"authorization": f"Bearer {KEY}"}, timeout=10
    ).json()["data"]
    assert events[-1]["dialect_notes"]["item_references"] == 36
