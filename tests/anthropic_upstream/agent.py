"""The scripted model: what the fake answers, decided from the request alone, deterministically.

It works through ``steps`` steps, one ``tool_use`` of the client's own tool per answer (Claude
Code's ``Bash`` with a command printing a large output, ``Read`` of a file the test names, or
any tool of the test, its required parameters filled from the step number), then answers
``DONE: ...``. With ``thinking`` on, every answer starts with a signed ``thinking`` block (and,
with ``redacted_thinking``, a ``redacted_thinking`` block before it), as Claude's do. When the
request offers ``read_tool_output`` and names a saved output, it reads one instead (at most
every ``read_every`` steps); a request without a client tool, with ``tool_choice: none`` or
holding Claude Code's own compaction prompt gets a summary and does not advance the run.

A plan is made on a copy of the run's state and committed only when it is answered, so a
failed request leaves the run where it was and its retry gets the same answer (same ids, same
signatures).
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from tests.agent_upstream import shell_command
from tests.anthropic_upstream.errors import b58
from tests.anthropic_upstream.protocol import READ_TOOL, blocks, text_of

DONE_PREFIX = "DONE:"
SUMMARY_PREFIX = "SUMMARY:"
# Claude Code's /compact and auto-compact prompt (its last user message), and the system prompt
# older versions used for that request.
COMPACTION_MARKS = (
    "create a detailed summary of the conversation so far",
    "Your task is to create a detailed summary",
    "You are a helpful AI assistant tasked with summarizing conversations",
)


@dataclass
class Conversation:
    """The state of one run (keyed by ``X-Agent-Run``, Claude Code's session id or the task)."""

    key: str
    step: int = 0  # steps issued to the client (tool_uses of its own tool)
    finished: bool = False
    reads: int = 0
    last_read_step: int = 0
    answers: int = 0  # answers given; ids and signatures derive from it
    cache: frozenset[bytes] = frozenset()  # prompt prefixes cached by this run's requests


@dataclass
class Plan:
    kind: str  # step, final, read, summary, stray
    content: list[dict[str, Any]]
    after: Conversation  # the run's state once this answer is given
    read_ids: set[str] = field(default_factory=set)
    mixed_ids: set[str] = field(default_factory=set)


def thinking_on(body: dict[str, Any]) -> bool:
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")


def is_compaction(body: dict[str, Any]) -> bool:
    """Claude Code's own summarization request (its prompt in the last user message or system)."""
    messages = body.get("messages")
    last = (
        next(
            (m for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "user"),
            None,
        )
        if isinstance(messages, list)
        else None
    )
    system = body.get("system")
    system_text = system if isinstance(system, str) else text_of({"content": system})
    texts = (text_of(last)[:6000] if last is not None else "", system_text)
    return any(mark in text for mark in COMPACTION_MARKS for text in texts)


def signature(*parts: Any) -> str:
    """Opaque and long like the real thing (base64), unique per block."""
    raw = b"".join(hashlib.sha256(f"{n}/{'/'.join(map(str, parts))}".encode()).digest() for n in range(9))
    return "Er" + base64.b64encode(raw).decode()


class ScriptedAgent:
    """See the module docstring; options as ``AnthropicUpstream`` documents them."""

    def __init__(
        self,
        *,
        steps: int,
        read_every: int,
        read_arguments: list[dict[str, Any]],
        read_preamble: str | None,
        mixed: Literal["after", "before"] | None,
        output_lines: int,
        tool: str | None,
        step_text: bool,
        redacted_thinking: bool,
        file_template: str | None,
    ) -> None:
        self.steps = steps
        self.read_every = read_every
        self.read_arguments = read_arguments
        self.read_preamble = read_preamble
        self.mixed = mixed
        self.output_lines = output_lines
        self.tool = tool
        self.step_text = step_text
        self.redacted_thinking = redacted_thinking
        self.file_template = file_template

    def client_tool(self, tools: Any) -> dict[str, Any] | None:
        """The client's tool to call: ``tool`` if set, else ``Bash``, else its first custom tool."""
        custom = [
            t
            for t in (tools if isinstance(tools, list) else [])
            if isinstance(t, dict) and t.get("type", "custom") == "custom" and t.get("name") != READ_TOOL
        ]
        wanted = [self.tool] if self.tool else ["Bash"]
        for name in wanted:
            for tool in custom:
                if tool.get("name") == name:
                    return tool
        return custom[0] if custom and not self.tool else None

    def arguments_for(self, tool: dict[str, Any], step: int) -> dict[str, Any]:
        """A shell command printing ``step_output(step)`` for a ``command``, the step's file for a
        ``file_path``, else the step number (or ``step-N``) in each required parameter."""
        raw = tool.get("input_schema")
        schema: dict[str, Any] = raw if isinstance(raw, dict) else {}
        properties: dict[str, Any] = schema.get("properties") or {}
        required: list[str] = schema.get("required") or list(properties)
        arguments: dict[str, Any] = {}
        if "command" in properties:
            arguments["command"] = shell_command(step, self.output_lines)
            if "description" in properties:
                arguments["description"] = f"Run scripted check {step}"
            return arguments
        for name in required:
            prop = properties.get(name)
            kind = prop.get("type") if isinstance(prop, dict) else None
            if name == "file_path":
                arguments[name] = (self.file_template or "check_{step}.log").format(step=step)
            elif kind in ("integer", "number"):
                arguments[name] = step
            elif kind == "boolean":
                arguments[name] = True
            else:
                arguments[name] = f"step-{step}"
        return arguments

    # ----- blocks -----

    def _thinking(self, conv: Conversation, label: str, thinking: bool) -> list[dict[str, Any]]:
        if not thinking:
            return []
        made: list[dict[str, Any]] = []
        if self.redacted_thinking:
            made.append(
                {"type": "redacted_thinking", "data": signature("redacted", conv.key, conv.answers, label)}
            )
        made.append(
            {
                "type": "thinking",
                "thinking": f"Planning {label}: I decide the next action from what I have seen so far.",
                "signature": signature("thinking", conv.key, conv.answers, label),
            }
        )
        return made

    @staticmethod
    def _use(conv: Conversation, name: str, arguments: dict[str, Any], label: str) -> dict[str, Any]:
        return {
            "type": "tool_use",
            "id": "toolu_01" + b58(conv.key, conv.answers, label),
            "name": name,
            "input": arguments,
        }

    # ----- the decision -----

    def plan(
        self,
        conv: Conversation,
        body: dict[str, Any],
        *,
        follow_up: bool,
        handles: list[str],
        offered_read: bool,
    ) -> Plan:
        """The answer to ``body`` given the run's state ``conv`` (not modified)."""
        after = replace(conv, answers=conv.answers + 1)
        thinking = thinking_on(body)
        tools = body.get("tools")
        choice = body.get("tool_choice")
        no_tools = isinstance(choice, dict) and choice.get("type") == "none"
        tool = None if no_tools else self.client_tool(tools)
        if tool is None or is_compaction(body):
            done = " and finished" if conv.finished else ""
            text = f"{SUMMARY_PREFIX} the agent ran {conv.step} of {self.steps} scripted checks{done}."
            label = f"summary-{after.answers}"
            return Plan(
                "summary", [*self._thinking(after, label, thinking), {"type": "text", "text": text}], after
            )
        if conv.finished and not follow_up:
            content = [
                *self._thinking(after, "stray", thinking),
                {"type": "text", "text": f"{DONE_PREFIX} already finished"},
            ]
            return Plan("stray", content, after)
        wants_read = (
            not follow_up
            and offered_read
            and bool(handles)
            and self.read_every > 0
            and conv.step - conv.last_read_step >= self.read_every
        )
        if wants_read:
            arguments = {"handle": handles[-1], **self.read_arguments[conv.reads % len(self.read_arguments)]}
            after.reads += 1
            after.last_read_step = conv.step
            label = f"read-{after.reads}"
            content = self._thinking(after, label, thinking)
            if self.read_preamble:
                content.append({"type": "text", "text": self.read_preamble})
            read = self._use(after, READ_TOOL, arguments, label)
            uses = [read]
            mixed: set[str] = set()
            if self.mixed and conv.step < self.steps:
                planned = self._use(
                    after, str(tool.get("name")), self.arguments_for(tool, conv.step + 1), f"mixed-{label}"
                )
                mixed.add(planned["id"])
                uses = [read, planned] if self.mixed == "after" else [planned, read]
            return Plan("read", content + uses, after, read_ids={read["id"]}, mixed_ids=mixed)
        if conv.step >= self.steps:
            after.finished = True
            done = f"{DONE_PREFIX} completed {self.steps} steps"
            return Plan(
                "final", [*self._thinking(after, "final", thinking), {"type": "text", "text": done}], after
            )
        after.step = step = conv.step + 1
        label = f"step-{step}"
        content = self._thinking(after, label, thinking)
        if self.step_text:
            content.append({"type": "text", "text": f"Step {step}: running scripted check {step}."})
        content.append(self._use(after, str(tool.get("name")), self.arguments_for(tool, step), label))
        return Plan("step", content, after)


def offers_read(tools: Any) -> bool:
    return any(
        isinstance(t, dict) and t.get("name") == READ_TOOL for t in (tools if isinstance(tools, list) else [])
    )


def run_key(body: dict[str, Any], headers: dict[str, str]) -> str:
    """``X-Agent-Run``, else Claude Code's ``X-Claude-Code-Session-Id``, else the task (the first
    text block): never message counts, since the proxy removes and summarizes old messages."""
    run = headers.get("x-agent-run")
    if run:
        return f"run:{run}"
    session = headers.get("x-claude-code-session-id")
    if session:
        return f"session:{session}"
    messages = body.get("messages")
    first = (
        next((m for m in messages if isinstance(m, dict) and m.get("role") == "user"), None)
        if isinstance(messages, list)
        else None
    )
    # The first text block: a proxy may join a summary to the task's message (the API merges
    # consecutive user turns anyway), never change the task itself.
    texts = [b["text"] for b in blocks(first) if isinstance(b, dict) and isinstance(b.get("text"), str)]
    return "task:" + (texts[0] if texts else "")
