"""The scripted model: what the fake Gemini answers, decided from the request alone.

It works through ``steps`` steps, one ``functionCall`` of the client's own tool per answer
(Gemini CLI's ``run_shell_command`` when declared, else the first function; a command printing
a large output, or each required parameter filled from the step number), with a short text
before it and, with ``thinkingConfig.includeThoughts``, a thought part first; then it answers
``DONE: ...``. The first call of an answer carries a ``thoughtSignature`` (a text-only answer:
its last text part), as Gemini 3 models do. Calls carry no ``id`` unless ``call_ids`` (the
Gemini API sends none; its clients make them up). When the request declares
``read_tool_output`` and names a saved output (``handle=out_...``), it reads one instead, at
most every ``read_every`` steps. Gemini CLI's own compression request (the ``<state_snapshot>``
prompts), or a request without tools, gets a ``SUMMARY:`` snapshot and does not advance the run.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from tests.agent_upstream import shell_command
from tests.gemini_protocol import calls_of, responses_of

READ_TOOL = "read_tool_output"
HANDLE = re.compile(r"handle=(out_[0-9a-f]+)")
DONE_PREFIX = "DONE:"
SUMMARY_PREFIX = "SUMMARY:"
COMPACTION_MARKS = ("Generate a new <state_snapshot>", "Critically evaluate the <state_snapshot>")


@dataclass
class Run:
    """One run's state (keyed by ``X-Agent-Run``, else its first user text)."""

    key: str
    step: int = 0  # calls of the client's tool issued
    reads: int = 0
    last_read_step: int = -1_000
    answers: int = 0  # answers given: ids and signatures derive from it


@dataclass
class Plan:
    kind: str  # step, read, final, summary
    parts: list[dict[str, Any]]
    after: Run
    signed: dict[str, dict[str, Any]] = field(default_factory=dict)  # signature -> the part


def signature(*parts: Any) -> str:
    """Opaque like the real thing (base64 bytes), unique per part."""
    return base64.b64encode(hashlib.sha256("/".join(map(str, parts)).encode()).digest() * 2).decode()


def texts(body: dict[str, Any]) -> list[str]:
    return [
        p["text"]
        for c in body.get("contents") or []
        if isinstance(c, dict)
        for p in c.get("parts") or []
        if isinstance(p, dict) and isinstance(p.get("text"), str)
    ]


def run_key(body: dict[str, Any], headers: dict[str, str]) -> str:
    if headers.get("x-agent-run"):
        return headers["x-agent-run"]
    first = texts(body)[:2]
    return hashlib.sha256(orjson.dumps(first)).hexdigest()[:16]


def declarations(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        d
        for tool in body.get("tools") or []
        if isinstance(tool, dict)
        for d in tool.get("functionDeclarations") or []
        if isinstance(d, dict)
    ]


def offers_read(body: dict[str, Any]) -> bool:
    mode = ((body.get("toolConfig") or {}).get("functionCallingConfig") or {}).get("mode")
    return mode != "NONE" and any(d.get("name") == READ_TOOL for d in declarations(body))


def is_read_follow_up(body: dict[str, Any]) -> bool:
    """The proxy's read round: the last content answers a ``read_tool_output`` call."""
    contents = body.get("contents") or []
    return bool(contents) and any(r.get("name") == READ_TOOL for r in responses_of(contents[-1]))


def is_compaction(body: dict[str, Any]) -> bool:
    return any(mark in text for text in texts(body)[-2:] for mark in COMPACTION_MARKS)


def handles(body: dict[str, Any]) -> list[str]:
    found = HANDLE.findall(orjson.dumps(body.get("contents") or []).decode())
    return list(dict.fromkeys(found))


def read_handles(body: dict[str, Any]) -> set[str]:
    """The handles read already in this request's read rounds."""
    return {
        str(call.get("args", {}).get("handle"))
        for content in body.get("contents") or []
        for call in calls_of(content)
        if call.get("name") == READ_TOOL
    }


def _instance(schema: dict[str, Any]) -> Any:
    """The smallest value a JSON schema (Gemini's, types in either case) takes: 1 for a number."""
    kind = str(schema.get("type", "object")).lower()
    if kind == "object":
        properties: dict[str, Any] = schema.get("properties") or {}
        return {name: _instance(properties.get(name) or {}) for name in schema.get("required") or properties}
    return {"integer": 1, "number": 1, "boolean": False, "array": []}.get(kind, "simple")


class ScriptedModel:
    def __init__(
        self,
        *,
        steps: int,
        read_every: int,
        output_lines: int,
        call_ids: bool,
        read_arguments: dict[str, Any],
    ) -> None:
        self.steps = steps
        self.read_every = read_every
        self.output_lines = output_lines
        self.call_ids = call_ids
        self.read_arguments = read_arguments

    def plan(self, run: Run, body: dict[str, Any]) -> Plan:
        after = replace(run, answers=run.answers + 1)
        thinking = ((body.get("generationConfig") or {}).get("thinkingConfig") or {}).get("includeThoughts")
        head = [{"text": f"Thinking about answer {after.answers}.", "thought": True}] if thinking else []
        schema = (body.get("generationConfig") or {}).get("responseJsonSchema")
        if isinstance(schema, dict):  # a structured side request (Gemini CLI's model router)
            return Plan("json", [{"text": orjson.dumps(_instance(schema)).decode()}], run)
        if is_compaction(body) or not declarations(body):
            snapshot = f"{SUMMARY_PREFIX} <state_snapshot>step {run.step} of {self.steps}</state_snapshot>"
            return self._signed(Plan("summary", [*head, {"text": snapshot}], run), run.key, after.answers)
        named = [h for h in handles(body) if h not in read_handles(body)]
        due = run.step - run.last_read_step >= self.read_every > 0
        if offers_read(body) and named and due and not is_read_follow_up(body):
            after.reads, after.last_read_step = run.reads + 1, run.step
            call = self._call(READ_TOOL, {"handle": named[0], **self.read_arguments}, after)
            parts = [*head, {"text": "Reading a saved output first."}, call]
            return self._signed(Plan("read", parts, after), run.key, after.answers)
        if run.step >= self.steps:
            done = {"text": f"{DONE_PREFIX} finished all {self.steps} steps."}
            return self._signed(Plan("final", [*head, done], after), run.key, after.answers)
        after.step = run.step + 1
        tool = self._client_tool(body)
        call = self._call(str(tool.get("name")), self._arguments(tool, after.step), after)
        parts = [*head, {"text": f"Step {after.step}: running the next check."}, call]
        return self._signed(Plan("step", parts, after), run.key, after.answers)

    def _client_tool(self, body: dict[str, Any]) -> dict[str, Any]:
        tools = [d for d in declarations(body) if d.get("name") != READ_TOOL]
        return next((d for d in tools if d.get("name") == "run_shell_command"), tools[0] if tools else {})

    def _arguments(self, tool: dict[str, Any], step: int) -> dict[str, Any]:
        schema = tool.get("parametersJsonSchema") or tool.get("parameters") or {}
        properties: dict[str, Any] = schema.get("properties") or {}
        if "command" in properties:
            return {"command": shell_command(step, self.output_lines), "description": f"check {step}"}
        required = schema.get("required") or list(properties)
        return {name: f"step-{step}" for name in required}

    def _call(self, name: str, args: dict[str, Any], after: Run) -> dict[str, Any]:
        call: dict[str, Any] = {"name": name, "args": args}
        if self.call_ids:
            call = {"id": f"call_{after.key[:8]}_{after.answers}", **call}
        return {"functionCall": call}

    @staticmethod
    def _signed(plan: Plan, key: str, answer: int) -> Plan:
        """The first call (else the last text part) carries the answer's signature."""
        at = next((i for i, p in enumerate(plan.parts) if "functionCall" in p), len(plan.parts) - 1)
        mark = signature(key, answer)
        plan.parts[at] = {**plan.parts[at], "thoughtSignature": mark}
        plan.signed[mark] = plan.parts[at]
        return plan
