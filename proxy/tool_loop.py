"""The ``read_tool_output`` loop: answer the model's reads inside the proxy, then ask again.

When the upstream's answer calls ``read_tool_output``, the proxy runs the reads against the
store, appends the call and its results to the messages and asks the upstream again, up to
``max_rounds`` rounds; the last round is sent with ``tool_choice: none`` so it ends in an
answer. The client receives only the final answer, with usage summed over all rounds.

If one answer mixes ``read_tool_output`` with the agent's own tool calls, the proxy resolves
its reads and asks again *without* the agent's calls of that answer: the model re-issues
them with the evidence in hand, and the agent never receives a call that was planned before
the model read what it asked for.

Streaming: text deltas are relayed as they arrive; tool-call deltas are held until the
choice's calls are complete; internal calls are resolved and the follow-up answer is streamed
on the same response, so the client receives one well-formed SSE stream ending in ``[DONE]``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from proxy.forwarding import client_response_headers
from proxy.read_tool import is_internal, run_read
from proxy.store import Store
from proxy.upstream import Upstream

Send = Callable[[dict[str, Any]], Awaitable[None]]
_USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")


async def _no_send(message: dict[str, Any]) -> None:
    raise RuntimeError("a LoopResult made outside ToolLoop.run has nowhere to send")


@dataclass
class LoopResult:
    rounds: int = 0
    reads: list[str] = field(default_factory=list)  # outcome of each read: ok, not_found, ...
    usage_per_round: list[dict[str, Any]] = field(default_factory=list)
    status: int = 0
    upstream_seconds: float = 0.0
    # The run's own context: the loop serves concurrent requests, so none of it is shared.
    request_id: bytes = b""
    mark_done: Callable[[], None] = lambda: None
    send: Send = field(default=_no_send)
    url: str = ""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    tenant: str = ""
    extra_headers: list[tuple[bytes, bytes]] = field(default_factory=list)


def _add_usage(total: dict[str, int], usage: Any) -> None:
    if isinstance(usage, dict):
        for key in _USAGE_KEYS:
            value = usage.get(key)
            if isinstance(value, int):
                total[key] = total.get(key, 0) + value


def _split_calls(message: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    calls = message.get("tool_calls") or []
    internal = [c for c in calls if is_internal(c)]
    return internal, [c for c in calls if not is_internal(c)]


class ToolLoop:
    def __init__(self, upstream: Upstream, store: Store, *, max_rounds: int, max_lines: int) -> None:
        self.upstream = upstream
        self.store = store
        self.max_rounds = max_rounds
        self.max_lines = max_lines

    async def _resolve(self, tenant: str, calls: list[Any], result: LoopResult) -> list[dict[str, Any]]:
        messages = []
        for call in calls:
            function = call.get("function") or {}
            text, outcome = await run_read(self.store, tenant, function.get("arguments"), self.max_lines)
            result.reads.append(outcome)
            messages.append({"role": "tool", "tool_call_id": call.get("id"), "content": text})
        return messages

    def _next_body(self, body: dict[str, Any], round_number: int) -> dict[str, Any]:
        if round_number >= self.max_rounds:
            return {**body, "tool_choice": "none"}
        return body

    async def run(
        self,
        send: Send,
        url: str,
        headers: list[tuple[bytes, bytes]],
        body: dict[str, Any],
        tenant: str,
        extra_headers: list[tuple[bytes, bytes]],
        request_id: str,
        mark_done: Callable[[], None] = lambda: None,
    ) -> LoopResult:
        """``mark_done`` is called just before the last message of the response is sent."""
        result = LoopResult(
            request_id=request_id.encode(),
            mark_done=mark_done,
            send=send,
            url=url,
            # The proxy must read these answers, so it asks for them uncompressed.
            headers=[(k, v) for k, v in headers if k != b"accept-encoding"]
            + [(b"accept-encoding", b"identity")],
            tenant=tenant,
            extra_headers=extra_headers,
        )
        if body.get("stream") is True:
            return await self._run_stream(body, result)
        return await self._run_json(body, result)

    async def _open_round(self, body: dict[str, Any], result: LoopResult) -> httpx.Response:
        payload = orjson.dumps(self._next_body(body, result.rounds))
        return await self.upstream.open("POST", result.url, result.headers, payload)

    async def _run_json(self, body: dict[str, Any], result: LoopResult) -> LoopResult:
        total: dict[str, int] = {}
        while True:
            started = time.perf_counter()
            response = await self._open_round(body, result)
            try:
                raw = await response.aread()
            finally:
                await response.aclose()
            result.upstream_seconds += time.perf_counter() - started
            result.status = response.status_code
            data: Any = None
            if response.status_code == 200:
                try:
                    data = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    data = None
            choice: Any = data["choices"][0] if isinstance(data, dict) and data.get("choices") else None
            message = choice.get("message") if isinstance(choice, dict) else None
            if not isinstance(message, dict):
                await self._send(response, raw, result)
                return result
            _add_usage(total, data.get("usage"))
            result.usage_per_round.append(data.get("usage") or {})
            internal, agent = _split_calls(message)
            if internal and result.rounds < self.max_rounds:
                result.rounds += 1
                assistant = {"role": "assistant", "content": message.get("content"), "tool_calls": internal}
                body = {
                    **body,
                    "messages": [
                        *body["messages"],
                        assistant,
                        *await self._resolve(result.tenant, internal, result),
                    ],
                }
                continue
            if internal:  # the round limit: never hand the agent an internal call
                message["tool_calls"] = agent or None
                if not agent:
                    message.pop("tool_calls", None)
                    choice["finish_reason"] = "stop"
            if total:
                data["usage"] = {**(data.get("usage") or {}), **total}
            await self._send(response, orjson.dumps(data), result)
            return result

    @staticmethod
    def _response_headers(response: httpx.Response, result: LoopResult) -> list[tuple[bytes, bytes]]:
        headers = [
            (k, v)
            for k, v in client_response_headers(response.headers.raw)
            if k not in (b"content-length", b"content-encoding")
        ]
        if not any(k == b"x-request-id" for k, _ in headers):
            headers.append((b"x-request-id", result.request_id))
        return headers

    async def _send(self, response: httpx.Response, body: bytes, result: LoopResult) -> None:
        headers = self._response_headers(response, result)
        headers += [(b"content-length", str(len(body)).encode()), *result.extra_headers]
        headers.append((b"x-compaction-read-rounds", str(result.rounds).encode()))
        await result.send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        result.mark_done()
        await result.send({"type": "http.response.body", "body": body, "more_body": False})

    async def _run_stream(self, body: dict[str, Any], result: LoopResult) -> LoopResult:
        total: dict[str, int] = {}
        started_response = False
        while True:
            started = time.perf_counter()
            response = await self._open_round(body, result)
            result.status = response.status_code
            try:
                if response.status_code != 200 and not started_response:
                    raw = await response.aread()
                    await self._send(response, raw, result)
                    return result
                if not started_response:
                    out = self._response_headers(response, result)
                    await result.send(
                        {
                            "type": "http.response.start",
                            "status": 200,
                            "headers": [*out, *result.extra_headers],
                        }
                    )
                    started_response = True
                stream = _HeldStream(result.send, result.mark_done)
                buffer = b""
                async for chunk in response.stream:  # type: ignore[union-attr]
                    buffer += chunk
                    *events, buffer = buffer.replace(b"\r\n", b"\n").split(b"\n\n")
                    for event in events:
                        await stream.take(event)
                if buffer.strip():
                    await stream.take(buffer)
            finally:
                await response.aclose()
                result.upstream_seconds += time.perf_counter() - started
            _add_usage(total, stream.usage)
            result.usage_per_round.append(stream.usage or {})
            internal = [c for c in stream.calls() if is_internal(c)]
            if internal and result.rounds < self.max_rounds:
                result.rounds += 1
                assistant = {"role": "assistant", "content": stream.text or None, "tool_calls": internal}
                body = {
                    **body,
                    "messages": [
                        *body["messages"],
                        assistant,
                        *await self._resolve(result.tenant, internal, result),
                    ],
                }
                continue
            await stream.finish(total)
            return result


class _HeldStream:
    """One upstream SSE stream as the client should see it: text relayed at once, tool-call
    deltas, the finishing chunk, usage and ``[DONE]`` held until the calls are known."""

    def __init__(self, send: Send, mark_done: Callable[[], None]) -> None:
        self.send = send
        self.mark_done = mark_done
        self.held: list[bytes] = []
        self.closing: list[bytes] = []
        self.text = ""
        self.usage: dict[str, Any] | None = None
        self._usage_event: dict[str, Any] | None = None
        self._calls: dict[int, dict[str, Any]] = {}

    async def take(self, event: bytes) -> None:
        data = b"".join(line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:"))
        if not data or data == b"[DONE]":
            return
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            await self._relay(event)
            return
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        if isinstance(chunk, dict) and chunk.get("usage") and not choices:
            self.usage, self._usage_event = chunk["usage"], chunk
            return
        choice = choices[0] if choices else None
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if isinstance(delta, dict) and delta.get("tool_calls"):
            for part in delta["tool_calls"]:
                self._merge(part)
            self.held.append(event)
            return
        if isinstance(choice, dict) and choice.get("finish_reason"):
            if isinstance(chunk.get("usage"), dict):
                self.usage = chunk["usage"]
            self.closing.append(event)
            return
        if isinstance(delta, dict) and isinstance(delta.get("content"), str):
            self.text += delta["content"]
        await self._relay(event)

    def _merge(self, part: dict[str, Any]) -> None:
        index = part.get("index", 0)
        call = self._calls.setdefault(
            index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if part.get("id"):
            call["id"] = part["id"]
        function = part.get("function") or {}
        call["function"]["name"] += function.get("name") or ""
        call["function"]["arguments"] += function.get("arguments") or ""

    def calls(self) -> list[dict[str, Any]]:
        return [self._calls[i] for i in sorted(self._calls)]

    async def _relay(self, event: bytes) -> None:
        await self.send({"type": "http.response.body", "body": event + b"\n\n", "more_body": True})

    async def finish(self, total_usage: dict[str, int]) -> None:
        for event in (*self.held, *self.closing):
            await self._relay(event)
        if self._usage_event is not None:
            self._usage_event["usage"] = {**self._usage_event["usage"], **total_usage}
            await self._relay(b"data: " + orjson.dumps(self._usage_event))
        self.mark_done()
        await self.send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
