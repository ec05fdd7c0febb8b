"""The scripted run the fake Chat Completions model plays: the large outputs its steps ask
for, and how it decides each answer from the request."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from policies.tokens import TokenCounter
from tests.agent_upstream.prefix_cache import PrefixCache
from tests.agent_upstream.protocol import (
    DONE_PREFIX,
    HANDLE,
    READ_TOOL,
    RUN_HEADER,
    STEP_MARK,
    Failure,
    is_read_follow_up,
    message_text,
    protocol_problems,
)
from tests.agent_upstream.records import Conversation, RequestRecords, Seen


def step_output_lines(step: int, lines: int = 90) -> list[str]:
    """What step ``step`` of a scripted run prints: ``lines`` lines of about 78 bytes, one in
    ten an ERROR line; 90 lines are about 7 KB, two thousand tokens."""
    ok = f"scanned module_{step}.py, all checks passed without warnings"
    error = f"ERROR: check did not pass, see the log of module_{step}.py"
    return [f"{STEP_MARK}-{step} line {n}: {error if n % 10 == 7 else ok}" for n in range(1, lines + 1)]


def step_output(step: int, lines: int = 90) -> str:
    return "\n".join(step_output_lines(step, lines))


def shell_command(step: int, lines: int = 90) -> str:
    """A harmless shell command (GNU seq and sed) printing ``step_output(step, lines)``."""
    return (
        f"seq -f '{STEP_MARK}-{step} line %g: scanned module_{step}.py, all checks passed without warnings' "
        f"{lines} | sed '7~10s/: .*/: ERROR: check did not pass, see the log of module_{step}.py/'"
    )


@dataclass
class Call:
    """One tool call the model makes."""

    id: str
    name: str
    arguments: str

    def as_message_part(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass
class Answer:
    content: str | None = None
    calls: list[Call] = field(default_factory=list)

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.calls else "stop"


class ScriptedModel(RequestRecords):
    """The scripted model, without the server around it. Options:

    ``window``: the context window enforced (tokens). ``steps``: client tool steps before the
    final answer. ``read_every``: make a ``read_tool_output`` call (when offered and a handle
    is named) once at least this many steps passed since the last read; 0 never reads.
    ``read_arguments``: the read arguments, in turn (the handle is added).
    ``read_all_handles``: a read answer asks for every named handle at once, one call each.
    ``read_preamble``: text streamed before a read call in the same answer.
    ``fail_read_follow_up``: fail the N-th read follow-up round (1-based, counted over the
    server's life) as ``failure`` says. ``final_command``: finish with this command (a call
    of the shell tool, or a text action) instead of a plain ``DONE:`` answer.
    ``action_fence``: the fence language of text actions. ``output_lines``: lines each step's
    command prints. ``step_command``: the command of step N (a function of N) instead of
    ``shell_command(N, output_lines)``. ``prefix_cache``: report
    ``usage.prompt_tokens_details.cached_tokens`` as OpenAI's automatic prefix caching does,
    against the last ``cache_horizon`` prompts served (``prefix_cache.PrefixCache``); off, 0.
    """

    def __init__(
        self,
        *,
        window: int = 6000,
        steps: int = 30,
        read_every: int = 3,
        read_arguments: list[dict[str, Any]] | None = None,
        read_preamble: str | None = None,
        read_all_handles: bool = False,
        fail_read_follow_up: int | None = None,
        failure: Failure | None = None,
        final_command: str | None = None,
        action_fence: str = "bash",
        output_lines: int = 90,
        model: str = "agent-model",
        prefix_cache: bool = False,
        cache_horizon: int = 32,
        step_command: Callable[[int], str] | None = None,
    ) -> None:
        self.window = window
        self.steps = steps
        self.read_every = read_every
        self.read_arguments = read_arguments or [{"num_lines": 40}, {"pattern": "ERROR"}]
        self.read_preamble = read_preamble
        self.read_all_handles = read_all_handles
        self.fail_read_follow_up = fail_read_follow_up
        self.failure = failure or Failure()
        self.final_command = final_command
        self.action_fence = action_fence
        self.output_lines = output_lines
        self.model = model
        self.counter = TokenCounter()
        self.step_command = step_command
        self.prefix_cache = PrefixCache(self.counter, cache_horizon) if prefix_cache else None
        self.requests: list[Seen] = []
        self.conversations: dict[str, Conversation] = {}
        self.read_follow_ups = 0
        self.failures_injected = 0

    @staticmethod
    def _task(messages: list[Any]) -> str:
        return next(
            (
                message_text(m.get("content"))
                for m in messages
                if isinstance(m, dict) and m.get("role") == "user"
            ),
            "",
        )

    def _key(self, messages: list[Any], headers: dict[str, str]) -> str:
        """The conversation: the client's run marker (``X-Agent-Run``) when it sends one, which
        survives anything the proxy does to the messages, else the first user message."""
        run = headers.get(RUN_HEADER)
        return f"run:{run}" if run else "task:" + self._task(messages)

    def _call_id(self, key: str, label: str) -> str:
        return "call_" + hashlib.sha256(f"{key}/{label}".encode()).hexdigest()[:24]

    @staticmethod
    def _client_tool(tools: Any) -> dict[str, Any] | None:
        for tool in tools if isinstance(tools, list) else []:
            function = tool.get("function") if isinstance(tool, dict) else None
            if isinstance(function, dict) and function.get("name") != READ_TOOL:
                return function
        return None

    def _arguments_for(self, function: dict[str, Any], step: int, command: str | None = None) -> str:
        """Arguments of the client's tool for ``step``: a shell command printing a large
        output when the tool takes a ``command``, else the step number in every integer
        parameter and ``step-N`` in every string parameter."""
        parameters = function.get("parameters") or {}
        properties = parameters.get("properties") or {}
        if "command" in properties:
            return orjson.dumps({"command": command or self._command(step)}).decode()
        arguments: dict[str, Any] = {}
        for name, schema in properties.items():
            kind = schema.get("type") if isinstance(schema, dict) else None
            if kind == "integer" or kind == "number":
                arguments[name] = step
            elif kind == "boolean":
                arguments[name] = True
            else:
                arguments[name] = f"step-{step}"
        return orjson.dumps(arguments).decode()

    def _command(self, step: int) -> str:
        """The shell command of ``step``."""
        return self.step_command(step) if self.step_command else shell_command(step, self.output_lines)

    def _text_action(self, thought: str, command: str) -> str:
        return f"THOUGHT: {thought}\n\n```{self.action_fence}\n{command}\n```"

    def _next_step(self, conv: Conversation, tools: Any, body: dict[str, Any]) -> tuple[str, Answer]:
        """Issue the conversation's next step, or its final answer."""
        client_tool = self._client_tool(tools)
        if client_tool is not None and body.get("tool_choice") == "none":
            # Like a real model told not to call tools: it can only say what it would do.
            return "no_tools", Answer(
                content=f"I would run step {conv.step + 1} next, but I may not call tools."
            )
        if conv.step >= self.steps:
            conv.finished = True
            done = f"{DONE_PREFIX} completed {self.steps} steps"
            if self.final_command is None:
                return "final", Answer(content=done)
            command = f"{self.final_command} && echo '{done}'"
            if client_tool is not None:
                return "final", Answer(
                    content=None,
                    calls=[
                        Call(
                            self._call_id(conv.key, "final"),
                            client_tool["name"],
                            self._arguments_for(client_tool, conv.step + 1, command),
                        )
                    ],
                )
            return "final", Answer(content=self._text_action("All steps are done; submitting.", command))
        conv.step += 1
        step = conv.step
        if client_tool is not None:
            call = Call(
                self._call_id(conv.key, f"step-{step}"),
                client_tool["name"],
                self._arguments_for(client_tool, step),
            )
            return "step", Answer(content=None, calls=[call])
        thought = f"Step {step} of {self.steps}: I run the next check and read its output."
        return "step", Answer(content=self._text_action(thought, self._command(step)))

    def _decide(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[Seen, Answer | Failure | None]:
        messages = body.get("messages") if isinstance(body.get("messages"), list) else []
        assert isinstance(messages, list)
        tools = body.get("tools")
        offered_read = any(
            isinstance(t, dict) and (t.get("function") or {}).get("name") == READ_TOOL
            for t in (tools if isinstance(tools, list) else [])
        )
        raw = orjson.dumps(messages).decode()
        handles = list(dict.fromkeys(HANDLE.findall(raw)))
        tokens = self.counter.count_request(body).total
        limit = body.get("max_completion_tokens") or body.get("max_tokens") or 0
        budget = tokens + (limit if isinstance(limit, int) else 0)
        follow_up = is_read_follow_up(messages)
        key = self._key(messages, headers)
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
            problems=protocol_problems(messages),
            task_kept=True,
            body=body,
            headers=headers,
        )
        if budget > self.window:
            seen.kind = "rejected"
            return seen, None
        if self.prefix_cache is not None:
            seen.cached = min(tokens, self.prefix_cache.serve(body))
        conv = self.conversations.setdefault(key, Conversation(key))
        task = self._task(messages)
        if conv.task is None:
            conv.task = task
        seen.task_kept = task == conv.task
        if follow_up:
            self.read_follow_ups += 1
            if self.fail_read_follow_up == self.read_follow_ups:
                self.failures_injected += 1
                seen.kind, seen.step = "failed", conv.step
                return seen, self.failure
        elif conv.finished:
            seen.kind, seen.step = "stray", conv.step
            return seen, Answer(content=f"{DONE_PREFIX} already finished")
        wants_read = (
            not follow_up
            and offered_read
            and handles
            and self.read_every > 0
            and conv.step - conv.last_read_step >= self.read_every
            and body.get("tool_choice") != "none"
        )
        if wants_read:
            extra = self.read_arguments[conv.reads % len(self.read_arguments)]
            conv.reads += 1
            conv.last_read_step = conv.step
            seen.kind, seen.step = "read", conv.step
            wanted = handles if self.read_all_handles else handles[-1:]
            calls = [
                Call(
                    self._call_id(conv.key, f"read-{conv.reads}" + (f"-{n}" if n else "")),
                    READ_TOOL,
                    orjson.dumps({"handle": handle, **extra}).decode(),
                )
                for n, handle in enumerate(wanted)
            ]
            return seen, Answer(content=self.read_preamble, calls=calls)
        kind, answer = self._next_step(conv, tools, body)
        seen.kind, seen.step = kind, conv.step
        return seen, answer
