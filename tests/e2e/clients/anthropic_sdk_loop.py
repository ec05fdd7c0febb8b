"""The official ``anthropic`` SDK driving an N-step tool-using session against a base URL (the
fake ``tests.anthropic_upstream.AnthropicUpstream`` directly, or the proxy in front of it).

The loop is an agent's: each answer's content blocks are appended to the history **verbatim**
(thinking blocks with their signatures included, as the SDK returned them), every ``tool_use``
of the local tool ``run_check`` is executed here (``step_output(step)``: about 2k tokens) and
answered with a ``tool_result``, and a single message-level ``cache_control`` breakpoint sits on
the last block of the last user message, moving each turn, as Claude Code does (the system
prompt carries a second one). Five ways to call the SDK (``VARIANTS``):

- ``create``: ``Anthropic().messages.create(...)`` (JSON);
- ``async``: ``AsyncAnthropic().messages.create(...)``;
- ``stream``: ``messages.create(stream=True)``, the raw events assembled here and checked for a
  well-formed stream (``stream_problems``);
- ``helper``: ``with messages.stream(...) as s: s.get_final_message()`` (the SDK's accumulator);
- ``async-helper``: the same with ``AsyncAnthropic``.

``run`` returns an ``AnthropicRun`` (final text, the steps the tool ran, per-turn usage, stop
reasons and request ids, the history). An SDK error (``anthropic.APIError``), or the HTTP
client's error for a stream cut mid-body (which the SDK does not wrap), is raised, or with
``raise_errors=False`` kept in ``error``/``errors`` with the run so far.
"""

from __future__ import annotations

import asyncio
import copy
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from tests.agent_upstream import step_output

API_KEY = "sk-ant-api03-compaction-proxy-tests-000000000000"
MODEL = "claude-sonnet-4-6"  # one the SDK does not warn about
TOOL_NAME = "run_check"
SYSTEM = "You are a careful agent. Run every scripted check with run_check, one per turn, then report."
EPHEMERAL = {"type": "ephemeral"}
Variant = Literal["create", "async", "stream", "helper", "async-helper"]
VARIANTS: tuple[Variant, ...] = ("create", "async", "stream", "helper", "async-helper")


@dataclass
class AnthropicRun:
    variant: str
    final: str = ""
    tool_steps: list[int] = field(default_factory=list)  # steps the tool ran, in order
    turns: int = 0  # answers received
    stop_reasons: list[str] = field(default_factory=list)
    usages: list[dict[str, Any]] = field(default_factory=list)  # usage of each answer
    request_ids: list[str] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)  # the history, as the client keeps it
    stream_problems: list[str] = field(default_factory=list)  # ``stream`` variant: ill-formed events
    errors: list[str] = field(default_factory=list)
    error: Exception | None = None
    seconds: float = 0.0

    def history_text(self) -> str:
        return orjson.dumps(self.messages, default=str).decode()


def tool_schema() -> dict[str, Any]:
    return {
        "name": TOOL_NAME,
        "description": "Run the scripted check number `step` and return its full log.",
        "input_schema": {
            "type": "object",
            "properties": {"step": {"type": "integer", "description": "The check's number."}},
            "required": ["step"],
        },
    }


def stream_problems(events: list[dict[str, Any]]) -> list[str]:
    """What makes a Messages event stream ill-formed: ``message_start`` not first, blocks not
    opened in index order or not closed, deltas for a block not open or of the wrong kind, a
    thinking block without a signature, tool input that is not JSON, ``message_delta`` missing,
    ``message_stop`` not last."""
    problems: list[str] = []
    kinds = [e.get("type") for e in events if e.get("type") != "ping"]
    if not kinds or kinds[0] != "message_start":
        problems.append(f"the first event is {kinds[0] if kinds else None}, not message_start")
    if not kinds or kinds[-1] != "message_stop":
        problems.append(f"the last event is {kinds[-1] if kinds else None}, not message_stop")
    if kinds.count("message_delta") != 1:
        problems.append(f"{kinds.count('message_delta')} message_delta events")
    allowed = {
        "text": {"text_delta", "citations_delta"},
        "thinking": {"thinking_delta", "signature_delta"},
        "tool_use": {"input_json_delta"},
    }
    open_block: tuple[int, str] | None = None
    next_index = 0
    signed = False
    partial = ""
    for event in events:
        kind = event.get("type")
        if kind == "content_block_start":
            if open_block is not None:
                problems.append(f"block {event.get('index')} starts before block {open_block[0]} stopped")
            if event.get("index") != next_index:
                problems.append(f"block {event.get('index')} starts, expected {next_index}")
            open_block = (int(event.get("index", -1)), str(event["content_block"].get("type")))
            next_index += 1
            signed, partial = False, ""
        elif kind == "content_block_delta":
            delta_kind = event["delta"].get("type")
            if open_block is None or event.get("index") != open_block[0]:
                problems.append(f"a {delta_kind} for block {event.get('index')}, which is not open")
            elif delta_kind not in allowed.get(open_block[1], set()):
                problems.append(f"a {delta_kind} in a {open_block[1]} block")
            signed = signed or delta_kind == "signature_delta"
            partial += str(event["delta"].get("partial_json", ""))
        elif kind == "content_block_stop":
            if open_block is None or event.get("index") != open_block[0]:
                problems.append(f"block {event.get('index')} stops, but it is not open")
            elif open_block[1] == "thinking" and not signed:
                problems.append(f"thinking block {open_block[0]} got no signature_delta")
            elif open_block[1] == "tool_use" and partial:
                try:
                    orjson.loads(partial)
                except orjson.JSONDecodeError:
                    problems.append(f"tool_use block {open_block[0]}: input is not JSON: {partial[:80]!r}")
            open_block = None
    if open_block is not None:
        problems.append(f"block {open_block[0]} never stopped")
    return problems


def assemble(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The message a raw event stream carries (content blocks assembled from their deltas)."""
    start = next((e for e in events if e.get("type") == "message_start"), None)
    message: dict[str, Any] = copy.deepcopy(start["message"]) if start else {"content": [], "usage": {}}
    partial: dict[int, str] = {}
    for event in events:
        kind = event.get("type")
        if kind == "content_block_start":
            message["content"].append(copy.deepcopy(event["content_block"]))
        elif kind == "content_block_delta":
            block, delta = message["content"][event["index"]], event["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            elif delta["type"] == "input_json_delta":
                partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
        elif kind == "content_block_stop" and event["index"] in partial:
            message["content"][event["index"]]["input"] = orjson.loads(partial[event["index"]] or "{}")
        elif kind == "message_delta":
            message.update(event["delta"])
            message["usage"] = {**message.get("usage", {}), **event.get("usage", {})}
    return message


def _with_breakpoint(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history as sent: ``cache_control`` on the last block of the last message (a user one)."""
    sent = list(messages)
    last = dict(sent[-1])
    blocks = [dict(b) for b in last["content"]]
    blocks[-1]["cache_control"] = EPHEMERAL
    last["content"] = blocks
    sent[-1] = last
    return sent


def _results(content: list[dict[str, Any]], ran: list[int], lines: int) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    for block in content:
        if block.get("type") != "tool_use":
            continue
        arguments = block.get("input") or {}
        if block.get("name") == TOOL_NAME and isinstance(arguments.get("step"), int):
            ran.append(arguments["step"])
            results.append(
                {
                    "type": "tool_result",
                    "tool_use_id": block["id"],
                    "content": step_output(arguments["step"], lines),
                }
            )
        else:
            error = f"Error: no tool {block.get('name')!r} with input {arguments!r}"
            results.append(
                {"type": "tool_result", "tool_use_id": block["id"], "content": error, "is_error": True}
            )
    return results


async def _ask(client: Any, variant: Variant, params: dict[str, Any], run: AnthropicRun) -> dict[str, Any]:
    """One answer as a plain message dict, whichever way the SDK is called."""
    if variant == "create":
        raw = client.messages.with_raw_response.create(**params)
        run.request_ids.append(str(raw.headers.get("request-id")))
        return dict(raw.parse().to_dict())
    if variant == "async":
        raw = await client.messages.with_raw_response.create(**params)
        run.request_ids.append(str(raw.headers.get("request-id")))
        return dict((await raw.parse()).to_dict())
    if variant == "stream":
        events: list[dict[str, Any]] = []
        with client.messages.create(**params, stream=True) as stream:
            run.request_ids.append(str(stream.response.headers.get("request-id")))
            events.extend(event.to_dict() for event in stream)
        run.stream_problems.extend(stream_problems(events))
        return assemble(events)
    if variant == "helper":
        with client.messages.stream(**params) as stream:
            run.request_ids.append(str(stream.response.headers.get("request-id")))
            return dict(stream.get_final_message().to_dict())
    async with client.messages.stream(**params) as astream:
        run.request_ids.append(str(astream.response.headers.get("request-id")))
        return dict((await astream.get_final_message()).to_dict())


async def _loop(
    client: Any,
    run: AnthropicRun,
    variant: Variant,
    task: str,
    *,
    model: str,
    max_turns: int,
    max_tokens: int,
    thinking_budget: int | None,
    cache: bool,
    output_lines: int,
) -> None:
    import anthropic

    run.messages.append({"role": "user", "content": [{"type": "text", "text": task}]})
    system: list[dict[str, Any]] = [
        {"type": "text", "text": SYSTEM, **({"cache_control": EPHEMERAL} if cache else {})}
    ]
    for _ in range(max_turns):
        params: dict[str, Any] = {
            "model": model,
            "max_tokens": max_tokens,
            "system": system,
            "tools": [tool_schema()],
            "messages": _with_breakpoint(run.messages) if cache else list(run.messages),
        }
        if thinking_budget is not None:
            params["thinking"] = {"type": "enabled", "budget_tokens": thinking_budget}
        try:
            message = await _ask(client, variant, params, run)
        except Exception as error:
            # The SDK's own errors, and the transport's (a stream cut mid-body surfaces as the HTTP
            # client's RemoteProtocolError, not wrapped by the SDK); anything else is a bug here.
            if not isinstance(error, anthropic.APIError) and not type(error).__module__.startswith("httpx"):
                raise
            run.error = error
            run.errors.append(f"{type(error).__name__}: {error}")
            return
        run.turns += 1
        run.stop_reasons.append(str(message.get("stop_reason")))
        run.usages.append(dict(message.get("usage") or {}))
        content = list(message.get("content") or [])
        run.messages.append({"role": "assistant", "content": content})
        results = _results(content, run.tool_steps, output_lines)
        if not results:
            run.final = "".join(str(b.get("text", "")) for b in content if b.get("type") == "text")
            return
        run.messages.append({"role": "user", "content": results})
    run.errors.append(f"no final answer after {max_turns} turns")


def run(
    base_url: str,
    task: str,
    *,
    variant: Variant = "create",
    max_turns: int = 80,
    headers: dict[str, str] | None = None,
    api_key: str = API_KEY,
    model: str = MODEL,
    max_tokens: int = 4096,
    thinking_budget: int | None = 1024,
    max_retries: int = 0,
    timeout: float = 30.0,
    cache: bool = True,
    output_lines: int = 90,
    raise_errors: bool = True,
) -> AnthropicRun:
    """One agent run of ``task`` with the SDK at ``base_url`` (see the module docstring).
    ``thinking_budget=None`` turns thinking off; ``max_retries`` is the SDK's own (0: none)."""
    import anthropic

    options: dict[str, Any] = {
        "base_url": base_url,
        "api_key": api_key,
        "max_retries": max_retries,
        "timeout": timeout,
        "default_headers": headers or {},
    }
    run_ = AnthropicRun(variant=variant)
    started = time.monotonic()
    loop_options: dict[str, Any] = {
        "model": model,
        "max_turns": max_turns,
        "max_tokens": max_tokens,
        "thinking_budget": thinking_budget,
        "cache": cache,
        "output_lines": output_lines,
    }
    if variant.startswith("async"):

        async def main() -> None:
            async with anthropic.AsyncAnthropic(**options) as client:
                await _loop(client, run_, variant, task, **loop_options)

        asyncio.run(main())
    else:
        # One loop for both clients: with the sync client it simply never awaits anything slow.
        with anthropic.Anthropic(**options) as client:
            asyncio.run(_loop(client, run_, variant, task, **loop_options))
    run_.seconds = time.monotonic() - started
    if raise_errors and run_.error is not None:
        raise run_.error
    return run_
