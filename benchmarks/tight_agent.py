"""A plain agent loop against the proxy's ``/v1/chat/completions``, as a coding agent runs it.

The agent always sends its whole history: the fixed prompt (system message and tools), the
task, then for each step the model's tool call and the output the agent produced for it
(``tight_prompt.StepPlan``, sized so that the step is about ``step_tokens`` tokens). It stops
at the model's final answer (no tool call), at an error answer, or after ``steps + 5``
requests. Each request carries ``X-Session-Id`` (the proxy keeps one session),
``X-Agent-Run`` (the fake model's conversation key) and ``X-Bench-Request`` (its number: the
fake's records tell which upstream requests served which agent request). No framework: httpx,
non-streaming, or streaming with the answer rebuilt from its chunks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from tight_prompt import Message, StepPlan, opening

from policies.tokens import TokenCounter

API_KEY = "sk-tight-windows-bench"


@dataclass
class AgentRequest:
    """One request the agent made and what came back."""

    number: int
    status: int
    tokens: int  # the agent's full history, in the proxy's count
    seconds: float
    headers: dict[str, str]  # the answer's x-compaction-* headers
    usage: dict[str, Any] | None = None
    error: str | None = None


@dataclass
class AgentRun:
    requests: list[AgentRequest] = field(default_factory=list)
    steps: int = 0  # tool calls answered
    finished: bool = False  # the model gave its final answer
    mismatched_commands: int = 0  # calls whose command was not the planned one


@dataclass(frozen=True)
class Agent:
    url: str  # the proxy's base, http://127.0.0.1:PORT
    model: str
    system: str
    tools: list[Any]
    step_tokens: int
    steps: int
    session: str
    plan: StepPlan
    stream: bool = False

    def headers(self, number: int) -> dict[str, str]:
        return {
            "authorization": f"Bearer {API_KEY}",
            "content-type": "application/json",
            "x-session-id": self.session,
            "x-agent-run": self.session,
            "x-bench-request": str(number),
        }

    def run(self, counter: TokenCounter) -> AgentRun:
        encoding = counter.encoding_for(self.model)
        history: list[Message] = opening(self.system)
        result = AgentRun()
        with httpx.Client(base_url=self.url, timeout=300, trust_env=False) as http:
            for number in range(1, self.steps + 6):
                body: dict[str, Any] = {"model": self.model, "messages": history, "tools": self.tools}
                if self.stream:
                    body |= {"stream": True, "stream_options": {"include_usage": True}}
                tokens = counter.count_request(body).total
                started = time.perf_counter()
                status, headers, message, usage, error = self._send(http, body, number)
                record = AgentRequest(number, status, tokens, time.perf_counter() - started, headers, usage)
                result.requests.append(record)
                if status != 200 or message is None:
                    record.error = error
                    return result
                calls = message.get("tool_calls") or []
                history = [*history, _as_history(message)]
                if not calls:
                    result.finished = True
                    return result
                for call in calls:
                    result.steps += 1
                    arguments = orjson.loads(call["function"]["arguments"] or "{}")
                    if arguments.get("command") != self.plan.command(result.steps):
                        result.mismatched_commands += 1
                    limit = self.step_tokens - counter.count_message(history[-1], encoding) // len(calls)
                    output = self.plan.output(result.steps, counter, self.model, call["id"], max(limit, 64))
                    history = [*history, {"role": "tool", "tool_call_id": call["id"], "content": output}]
        return result

    def _send(
        self, http: httpx.Client, body: dict[str, Any], number: int
    ) -> tuple[int, dict[str, str], Message | None, dict[str, Any] | None, str | None]:
        """(status, x-compaction-* headers, assistant message, usage, error text)."""
        with http.stream(
            "POST", "/v1/chat/completions", content=orjson.dumps(body), headers=self.headers(number)
        ) as response:
            raw = response.read()
            headers = {k: v for k, v in response.headers.items() if k.lower().startswith("x-compaction-")}
            if response.status_code != 200:
                return response.status_code, headers, None, None, raw.decode(errors="replace")[:500]
            if not self.stream:
                data = orjson.loads(raw)
                return 200, headers, data["choices"][0]["message"], data.get("usage"), None
            message, usage = assemble(raw)
            return 200, headers, message, usage, None


def _as_history(message: Message) -> Message:
    """The assistant message as an agent keeps it: role, content, tool calls."""
    kept: Message = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        kept["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": dict(c["function"])}
            for c in message["tool_calls"]
        ]
    return kept


def assemble(raw: bytes) -> tuple[Message, dict[str, Any] | None]:
    """The assistant message and usage of a streamed answer (``chat.completion.chunk`` events)."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    usage = None
    for line in raw.split(b"\n"):
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = orjson.loads(line[6:])
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                content.append(delta["content"])
            for part in delta.get("tool_calls") or []:
                call = calls.setdefault(
                    part["index"], {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                call["id"] = part.get("id") or call["id"]
                function = part.get("function") or {}
                call["function"]["name"] += function.get("name") or ""
                call["function"]["arguments"] += function.get("arguments") or ""
    message: Message = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message, usage
