"""The scripted run the fake Responses model plays: a reasoning model that calls the client's
tool once per step, reads saved outputs back when the proxy offers ``read_tool_output``, and
decides each answer from the request."""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import orjson

from policies.tokens import TokenCounter
from proxy.dialects.responses import ResponsesDialect
from tests.agent_upstream.script import shell_command
from tests.responses_upstream import checks
from tests.responses_upstream.protocol import (
    DONE_PREFIX,
    HANDLE,
    READ_TOOL,
    RUN_HEADER,
    SUMMARY_PREFIX,
    Failure,
    context_length_error,
    input_items,
    invalid_request,
    item_kind,
    message_text,
)
from tests.responses_upstream.records import Conversation, RequestRecords, Seen


def stable_hex(*parts: Any, size: int = 24) -> str:
    """A hex id derived from ``parts``: the same run gets the same ids every time."""
    return hashlib.sha256("/".join(str(p) for p in parts).encode()).hexdigest()[:size]


class ScriptedReasoningModel(RequestRecords):
    """The scripted reasoning model, without the server around it. Options:

    ``window``: the context window enforced (tokens). ``steps``: client tool steps before the
    final answer. ``read_every``: read a saved output (when offered and a handle is named) once
    at least this many steps passed since the last read; 0 never reads. ``read_arguments``: the
    read arguments, in turn (the handle is added). ``read_preamble``: text of a message item
    before a read call in the same answer. ``mixed``: a read answer also calls the client's tool
    (``"after"`` the read call or ``"before"`` it): a *mixed answer*, whose client call the
    proxy must drop (the model re-issues it after the read); a client that runs it shows it as
    a step run twice. ``mixed_calls`` records their call ids. ``fail_read_follow_up``: fail the
    N-th read follow-up round (1-based, over the server's life) as ``failure`` says.
    ``output_lines``: lines each step's command or function prints. ``strict``: refuse protocol
    problems with a 400 (else they are recorded and answered). ``tool``: the name of the client
    tool to call (default: ``exec_command``, ``shell`` or ``local_shell`` when offered, else the
    first function tool)."""

    def __init__(
        self,
        *,
        window: int = 6000,
        steps: int = 30,
        read_every: int = 1,
        read_arguments: list[dict[str, Any]] | None = None,
        read_preamble: str | None = None,
        mixed: Literal["after", "before"] | None = None,
        fail_read_follow_up: int | None = None,
        failure: Failure | None = None,
        output_lines: int = 90,
        strict: bool = False,
        tool: str | None = None,
        model: str = "agent-model",
    ) -> None:
        self.window = window
        self.steps = steps
        self.read_every = read_every
        self.read_arguments = read_arguments or [{"num_lines": 40}, {"pattern": "ERROR"}]
        self.read_preamble = read_preamble
        self.mixed = mixed
        self.mixed_calls: set[str] = set()
        self.fail_read_follow_up = fail_read_follow_up
        self.failure = failure or Failure()
        self.output_lines = output_lines
        self.strict = strict
        self.tool = tool
        self.model = model
        self.counter = TokenCounter()
        self.dialect = ResponsesDialect()
        self.requests: list[Seen] = []
        self.conversations: dict[str, Conversation] = {}
        self.encrypted: dict[str, str] = {}  # reasoning id -> the encrypted_content emitted
        self.read_calls: set[str] = set()  # call ids of the read_tool_output calls emitted
        self.followers: dict[str, str] = {}  # reasoning id -> the id of the item after it, as emitted
        self.read_follow_ups = 0
        self.failures_injected = 0

    def _key(self, items: list[Any], headers: dict[str, str]) -> str:
        run = headers.get(RUN_HEADER)
        if run:
            return f"run:{run}"
        session = headers.get("session-id")
        if session:
            return f"session:{session}"
        task = next(
            (
                message_text(i.get("content"))
                for i in items
                if isinstance(i, dict) and item_kind(i) == "message" and i.get("role") == "user"
            ),
            "",
        )
        return "task:" + task

    def _client_tool(self, tools: Any) -> dict[str, Any] | None:
        functions = [
            t
            for t in (tools if isinstance(tools, list) else [])
            if isinstance(t, dict)
            and t.get("type") in ("function", "local_shell")
            and t.get("name") != READ_TOOL
        ]
        wanted = [self.tool] if self.tool else ["exec_command", "shell", "local_shell"]
        for name in wanted:
            for tool in functions:
                if tool.get("name", tool.get("type")) == name:
                    return tool
        return functions[0] if functions and not self.tool else None

    def _arguments_for(self, tool: dict[str, Any], step: int) -> str:
        """Arguments of the client's tool for ``step``: a shell command printing a large output
        (``cmd`` for Codex's ``exec_command``, ``command`` as a string or an argv list), else the
        step number in every integer parameter and ``step-N`` in every string parameter."""
        command = shell_command(step, self.output_lines)
        properties = (tool.get("parameters") or {}).get("properties") or {}
        if "cmd" in properties:
            return orjson.dumps({"cmd": command, "yield_time_ms": 10_000}).decode()
        if "command" in properties:
            if (properties["command"] or {}).get("type") == "array":
                return orjson.dumps({"command": ["bash", "-lc", command], "timeout_ms": 10_000}).decode()
            return orjson.dumps({"command": command}).decode()
        arguments: dict[str, Any] = {}
        for name, schema in properties.items():
            kind = schema.get("type") if isinstance(schema, dict) else None
            if kind in ("integer", "number"):
                arguments[name] = step
            elif kind == "boolean":
                arguments[name] = True
            else:
                arguments[name] = f"step-{step}"
        return orjson.dumps(arguments).decode()

    def _reasoning(self, conv: Conversation, label: str) -> dict[str, Any]:
        item_id = "rs_" + stable_hex(conv.key, conv.answers, label, size=32)
        # Opaque like the real thing: base64-ish, long, unique per item.
        blob = "gAAAAA" + "".join(stable_hex(item_id, n, size=64) for n in range(6))
        self.encrypted[item_id] = blob
        return {
            "id": item_id,
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": f"**Planning** {label}: I decide the next action."}],
            "encrypted_content": blob,
        }

    def _message(self, conv: Conversation, text: str, label: str) -> dict[str, Any]:
        return {
            "id": "msg_" + stable_hex(conv.key, conv.answers, label, size=32),
            "type": "message",
            "status": "completed",
            "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": text}],
            "role": "assistant",
        }

    def _call(self, conv: Conversation, name: str, arguments: str, label: str) -> dict[str, Any]:
        return {
            "id": "fc_" + stable_hex(conv.key, conv.answers, label, size=32),
            "type": "function_call",
            "status": "completed",
            "arguments": arguments,
            "call_id": "call_" + stable_hex(conv.key, label),
            "name": name,
        }

    def _next_step(self, conv: Conversation, tools: Any) -> tuple[str, list[dict[str, Any]]]:
        """The conversation's next step, or its final answer."""
        tool = self._client_tool(tools)
        if conv.step >= self.steps or tool is None:
            if tool is not None:
                conv.finished = True
                done = f"{DONE_PREFIX} completed {self.steps} steps"
                return "final", [self._reasoning(conv, "final"), self._message(conv, done, "final")]
            return "summary", []
        step = conv.step + 1
        label = f"step-{step}"
        name = str(tool.get("name"))
        call = self._call(conv, name, self._arguments_for(tool, step), label)
        return "step", [self._reasoning(conv, label), call]

    def _decide(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[Seen, Any]:
        """The record of a request and what to answer: output items, a ``Failure``, or an
        error body with its status."""
        items = input_items(body)
        tools = body.get("tools")
        offered_read = any(
            isinstance(t, dict) and t.get("name") == READ_TOOL
            for t in (tools if isinstance(tools, list) else [])
        )
        handles = list(dict.fromkeys(HANDLE.findall(orjson.dumps(items).decode())))
        tokens = self.dialect.count(body, self.counter)
        limit = body.get("max_output_tokens")
        budget = tokens + (limit if isinstance(limit, int) else 0)
        follow_up = checks.is_read_follow_up(items, self.read_calls)
        metadata = headers.get("x-codex-turn-metadata", "")
        request_kind = ""
        try:
            parsed = orjson.loads(metadata) if metadata else None
            if isinstance(parsed, dict) and isinstance(parsed.get("request_kind"), str):
                request_kind = parsed["request_kind"]
        except orjson.JSONDecodeError:
            request_kind = "compaction" if "compaction" in metadata else ""
        key = self._key(items, headers)
        seen = Seen(
            index=len(self.requests),
            conversation=key,
            tokens=tokens,
            budget=budget,
            stream=body.get("stream") is True,
            kind="",
            step=0,
            offered_read=offered_read,
            read_follow_up=follow_up,
            handles=handles,
            problems=checks.protocol_problems(items),
            reasoning_problems=checks.reasoning_problems(items, self.encrypted),
            follower_changes=checks.follower_changes(items, self.followers),
            leaks=checks.read_leaks(items, follow_up, self.read_calls),
            request_kind=request_kind,
            body=body,
            headers=headers,
        )
        if any(isinstance(i, dict) and i.get("type") == "compaction" for i in items):
            # OpenAI's own compaction item: a provider that is not OpenAI cannot read one. (A
            # `compaction_trigger` it does not know is dropped: the request is answered as usual,
            # as the gateways of Codex's "got 0 compaction output items" reports do.)
            seen.kind = "unknown_item"
            message = "Invalid value: 'compaction'. This model does not support compaction items."
            return seen, (400, invalid_request(message))
        if budget > self.window:
            seen.kind = "rejected"
            return seen, (400, context_length_error())
        if self.strict and seen.problems:
            seen.kind = "invalid"
            return seen, (400, invalid_request(seen.problems[0]))
        conv = self.conversations.setdefault(key, Conversation(key))
        conv.answers += 1
        if follow_up:
            self.read_follow_ups += 1
            if self.fail_read_follow_up == self.read_follow_ups:
                self.failures_injected += 1
                seen.kind, seen.step = "failed", conv.step
                return seen, self.failure
        elif conv.finished and self._client_tool(tools) is not None:
            seen.kind, seen.step = "stray", conv.step
            return seen, [self._message(conv, f"{DONE_PREFIX} already finished", "stray")]
        wants_read = (
            not follow_up
            and offered_read
            and handles
            and self.read_every > 0
            and conv.step - conv.last_read_step >= self.read_every
            and body.get("tool_choice") != "none"
        )
        if wants_read:
            arguments = {"handle": handles[-1], **self.read_arguments[conv.reads % len(self.read_arguments)]}
            conv.reads += 1
            conv.last_read_step = conv.step
            seen.kind, seen.step = "read", conv.step
            label = f"read-{conv.reads}"
            output = [self._reasoning(conv, label)]
            if self.read_preamble:
                output.append(self._message(conv, self.read_preamble, label))
            call = self._call(conv, READ_TOOL, orjson.dumps(arguments).decode(), label)
            self.read_calls.add(call["call_id"])
            calls = [call]
            tool = self._client_tool(tools)
            if self.mixed and tool is not None and conv.step < self.steps:
                planned = self._call(
                    conv, str(tool.get("name")), self._arguments_for(tool, conv.step + 1), f"mixed-{label}"
                )
                self.mixed_calls.add(planned["call_id"])
                calls = [call, planned] if self.mixed == "after" else [planned, call]
            output.extend(calls)
            return seen, output
        kind, output = self._next_step(conv, tools)
        if kind == "step":
            conv.step += 1
        if kind == "summary":
            done = " and finished" if conv.finished else ""
            text = f"{SUMMARY_PREFIX} the agent ran {conv.step} of {self.steps} scripted checks{done}."
            output = [self._message(conv, text, f"summary-{conv.answers}")]
        seen.kind, seen.step = kind, conv.step
        return seen, output
