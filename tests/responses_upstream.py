"""A fake OpenAI **Responses API** server (``POST /v1/responses``) that plays the MODEL of an
agent loop, the Responses counterpart of ``tests.agent_upstream.AgentUpstream``.

It decides each answer from the request, deterministically, the way a reasoning model driving
a real agent would, and checks what it receives the way the real server does:

- **The window.** A request whose input tokens (the project's own count,
  ``ResponsesDialect().count``) plus ``max_output_tokens`` exceed ``window`` gets OpenAI's real
  answer: HTTP 400 ``context_length_exceeded`` (``param: input``).
- **The protocol.** Every ``function_call``/``custom_tool_call``/``local_shell_call`` in
  ``input`` has its output (same ``call_id``) later in ``input``, every output answers an
  earlier call, no call id is used twice, and a ``reasoning`` item is followed by another output
  item of its turn (not last, not followed by a user message or a tool output). Problems are
  recorded per request (``strict=True`` also refuses such a request with the 400 OpenAI sends).
- **Reasoning.** Every ``reasoning`` item it emits carries an ``encrypted_content``; when an
  item comes back in a later ``input``, its ``encrypted_content`` must be byte-identical to what
  was emitted (and its id one the server issued). Differences are recorded.
- **Leaks.** A request that is not a read follow-up round (its last input item is not a
  ``read_tool_output`` result) must hold no ``read_tool_output`` call or result: those come
  from the client's own history, which must never have seen one.

The scripted agent works through ``steps`` steps: each answer is a ``reasoning`` item and one
call of the client's own tool (Codex's ``exec_command``/``shell``, or a function tool of the
test) with arguments that make the client produce a large output; then a final ``message``
``DONE: ...``. When the proxy offers ``read_tool_output`` and the input names a saved output
(``handle=out_<hex>``), it reads one (``reasoning`` + ``function_call read_tool_output``) once
at least ``read_every`` steps passed since its last read; the proxy answers the call itself
and asks again (a *read follow-up round*). A request without any function tool (Codex's own
compaction request: ``tools: []`` and a summary prompt) gets a plain summary message and does
not advance the run.

It fails the N-th read follow-up round on demand: an HTTP status (500, 429 with
``retry-after``), or a connection reset after some events of the answer's stream (before any
byte for a non-streamed request). With ``read_preamble`` the read answer streams that text
before its call, so a later failure comes after text already reached the client.

It streams exactly like OpenAI (``event: <type>`` + ``data: {json}``, ``response.created``,
``response.in_progress``, per item ``output_item.added`` ... ``output_item.done`` with
``content_part``/``output_text``, ``function_call_arguments`` and ``reasoning_summary_*`` events,
``response.completed`` with the full response object; every event numbered by
``sequence_number``); the non-streamed answer is that same response object.

The state of a run is keyed by the client's ``X-Agent-Run`` header, else Codex's
``session-id`` header, else the first user message: never by item counts, since the proxy
removes and summarizes old items. It runs in a thread with its own event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from aiohttp import web

from policies.tokens import TokenCounter
from proxy.dialects.responses import ResponsesDialect
from tests.agent_upstream import STEP_MARK, shell_command, step_output
from tests.fake_upstream import free_port

READ_TOOL = "read_tool_output"
HANDLE = re.compile(r"handle=(out_[0-9a-f]{16})")
DONE_PREFIX = "DONE:"
SUMMARY_PREFIX = "SUMMARY:"
RUN_HEADER = "x-agent-run"
CALLS = frozenset({"function_call", "custom_tool_call", "local_shell_call"})
OUTPUTS = {
    "function_call_output": "function_call",
    "custom_tool_call_output": "custom_tool_call",
    "local_shell_call_output": "local_shell_call",
}
# Items a model produces (what may follow a reasoning item in its turn).
MODEL_ITEMS = frozenset({"reasoning", "message", *CALLS})
CONTEXT_MESSAGE = (
    "Your input exceeds the context window of this model. Please adjust your input and try again."
)

__all__ = [
    "DONE_PREFIX",
    "HANDLE",
    "READ_TOOL",
    "RUN_HEADER",
    "STEP_MARK",
    "SUMMARY_PREFIX",
    "Failure",
    "ResponsesUpstream",
    "Seen",
    "context_length_error",
    "protocol_problems",
    "shell_command",
    "step_output",
]


def context_length_error() -> dict[str, Any]:
    """The Responses API's own answer to an input over the model's context window (HTTP 400)."""
    return {
        "error": {
            "message": CONTEXT_MESSAGE,
            "type": "invalid_request_error",
            "param": "input",
            "code": "context_length_exceeded",
        }
    }


def invalid_request(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": "input", "code": None}}


def server_error() -> dict[str, Any]:
    return {
        "error": {
            "message": "The server had an error while processing your request. Sorry about that!",
            "type": "server_error",
            "param": None,
            "code": "server_error",
        }
    }


def rate_limit_error() -> dict[str, Any]:
    return {
        "error": {
            "message": "Rate limit reached for agent-model on requests per min (RPM): Limit 3, Used 3.",
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }


@dataclass(frozen=True)
class Failure:
    """How to fail a read follow-up round. ``status``: answer ``status`` with an OpenAI error
    body (500 ``server_error``, 429 ``rate_limit_exceeded`` with ``retry-after: 0``).
    ``reset``: send ``after_events`` events of the answer's stream and cut the connection (a
    non-streamed request is cut before any byte)."""

    kind: Literal["status", "reset"] = "status"
    status: int = 500
    after_events: int = 4

    def error_body(self) -> dict[str, Any]:
        return rate_limit_error() if self.status == 429 else server_error()


@dataclass
class Conversation:
    key: str
    step: int = 0  # steps issued to the client (calls of its own tool)
    finished: bool = False
    reads: int = 0
    last_read_step: int = 0
    answers: int = 0  # answers given (ids of items are derived from it)


@dataclass(repr=False)
class Seen:
    """One ``/v1/responses`` request as the fake received it, and what it did with it."""

    index: int
    conversation: str
    tokens: int  # input tokens, in the project's count
    budget: int  # tokens + max_output_tokens
    stream: bool
    kind: str  # rejected, step, final, read, failed, stray, summary, invalid
    step: int
    offered_read: bool
    read_follow_up: bool
    handles: list[str]
    problems: list[str]  # protocol problems of the input
    reasoning_problems: list[str]  # reasoning items that came back altered or unknown
    leaks: list[str]  # read_tool_output items in a request that came from the client's history
    follower_changes: list[str]  # reasoning items followed by another item than when emitted
    request_kind: str  # Codex's x-codex-turn-metadata request_kind (turn, compaction), else ""
    body: dict[str, Any]
    headers: dict[str, str]
    output: list[dict[str, Any]] = field(default_factory=list)  # the answer's output items

    def __repr__(self) -> str:
        return (
            f"<request {self.index} {self.kind} step={self.step} tokens={self.tokens} budget={self.budget} "
            f"stream={self.stream} follow_up={self.read_follow_up} problems={len(self.problems)}>"
        )


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "") if isinstance(part, dict) and isinstance(part.get("text"), str) else ""
            for part in content
        )
    return ""


def _items(body: dict[str, Any]) -> list[Any]:
    raw = body.get("input")
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": raw}]
    return raw if isinstance(raw, list) else []


def _kind(item: Any) -> str | None:
    return item.get("type", "message") if isinstance(item, dict) else None


def protocol_problems(items: list[Any]) -> list[str]:
    """Protocol problems of a Responses ``input``, as the real server refuses them."""
    problems: list[str] = []
    calls: dict[str, tuple[int, str]] = {}  # call_id -> (position, type)
    answered: set[str] = set()
    for position, item in enumerate(items):
        kind = _kind(item)
        if kind is None:
            problems.append(f"input[{position}] is not an object")
            continue
        assert isinstance(item, dict)
        if kind in CALLS:
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                problems.append(f"input[{position}]: a {kind} without a call_id")
                continue
            if call_id in calls:
                problems.append(f"input[{position}]: call_id {call_id!r} used twice")
            calls[call_id] = (position, kind)
        elif kind in OUTPUTS:
            call_id = item.get("call_id")
            call = calls.get(call_id) if isinstance(call_id, str) else None
            if call is None:
                problems.append(f"input[{position}]: No tool call found for {kind} with call_id {call_id!r}")
            elif call[1] != OUTPUTS[kind]:
                problems.append(f"input[{position}]: {kind} answers a {call[1]} ({call_id!r})")
            elif call_id in answered:
                problems.append(f"input[{position}]: {kind} for {call_id!r} answered twice")
            else:
                answered.add(call_id)  # type: ignore[arg-type]
        elif kind == "reasoning":
            following = items[position + 1] if position + 1 < len(items) else None
            next_kind = _kind(following)
            is_model_item = next_kind in MODEL_ITEMS and not (
                next_kind == "message"
                and isinstance(following, dict)
                and following.get("role") != "assistant"
            )
            if not is_model_item:
                where = (
                    "last" if following is None else f"followed by {next_kind} {following.get('role', '')}"
                )
                problems.append(
                    f"input[{position}]: Item {item.get('id')!r} of type 'reasoning' was provided without "
                    f"its required following item ({where.strip()})"
                )
    for call_id, (position, kind) in calls.items():
        if call_id not in answered:
            problems.append(f"input[{position}]: No tool output found for {kind} call {call_id!r}")
    return problems


def _read_call_ids(items: list[Any]) -> set[str]:
    return {
        str(i.get("call_id"))
        for i in items
        if isinstance(i, dict) and i.get("type") == "function_call" and i.get("name") == READ_TOOL
    }


def is_read_follow_up(items: list[Any], read_calls: set[str] | frozenset[str] = frozenset()) -> bool:
    """The request ends with the result of a ``read_tool_output`` call (one in ``items``, or one
    of ``read_calls``, the ids of the read calls the model made): the proxy asks again after
    answering a read."""
    if not items or not isinstance(items[-1], dict) or items[-1].get("type") != "function_call_output":
        return False
    call_id = str(items[-1].get("call_id"))
    return call_id in read_calls or call_id in _read_call_ids(items)


def _pieces(text: str, count: int) -> list[str]:
    """``text`` split into about ``count`` pieces (none when empty)."""
    if not text:
        return []
    size = max(1, -(-len(text) // count))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _hex(*parts: Any, size: int = 24) -> str:
    return hashlib.sha256("/".join(str(p) for p in parts).encode()).hexdigest()[:size]


class ResponsesUpstream:
    """The scripted reasoning model. Options:

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
        self.others: list[tuple[str, str, dict[str, str]]] = []  # (method, path, headers) of other routes
        self.conversations: dict[str, Conversation] = {}
        self.encrypted: dict[str, str] = {}  # reasoning id -> the encrypted_content emitted
        self.read_calls: set[str] = set()  # call ids of the read_tool_output calls emitted
        self.followers: dict[str, str] = {}  # reasoning id -> the id of the item after it, as emitted
        self.read_follow_ups = 0
        self.failures_injected = 0
        self.port = 0
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._started = threading.Event()

    # ----- what tests read back -----

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def rejected(self) -> list[Seen]:
        return [s for s in self.requests if s.kind == "rejected"]

    @property
    def max_tokens_seen(self) -> int:
        return max((s.budget for s in self.requests), default=0)

    @property
    def problems(self) -> list[str]:
        return [f"request {s.index}: {p}" for s in self.requests for p in s.problems]

    @property
    def reasoning_problems(self) -> list[str]:
        return [f"request {s.index}: {p}" for s in self.requests for p in s.reasoning_problems]

    @property
    def leaks(self) -> list[str]:
        return [f"request {s.index}: {p}" for s in self.requests for p in s.leaks]

    @property
    def follower_changes(self) -> list[str]:
        return [f"request {s.index}: {p}" for s in self.requests for p in s.follower_changes]

    @property
    def reads(self) -> list[Seen]:
        return [s for s in self.requests if s.kind == "read"]

    @property
    def follow_ups(self) -> list[Seen]:
        return [s for s in self.requests if s.read_follow_up]

    @property
    def reasoning_echoed(self) -> int:
        """Reasoning items the server emitted and saw again (checked byte for byte)."""
        seen: set[str] = set()
        for request in self.requests:
            for item in _items(request.body):
                if (
                    isinstance(item, dict)
                    and item.get("type") == "reasoning"
                    and item.get("id") in self.encrypted
                ):
                    seen.add(str(item["id"]))
        return len(seen)

    def conversation(self) -> Conversation:
        """The only conversation (tests run one agent run per server)."""
        assert len(self.conversations) == 1, f"expected one conversation, saw {list(self.conversations)}"
        return next(iter(self.conversations.values()))

    def summary(self) -> str:
        """One line per request, for assertion messages."""
        return "\n".join(
            f"#{s.index} {s.kind} step={s.step} tokens={s.tokens} budget={s.budget} stream={s.stream} "
            f"items={len(_items(s.body))} handles={len(s.handles)} read_offered={s.offered_read} "
            f"follow_up={s.read_follow_up} "
            f"problems={len(s.problems)} reasoning={len(s.reasoning_problems)} leaks={len(s.leaks)}"
            + (f" request_kind={s.request_kind}" if s.request_kind else "")
            for s in self.requests
        )

    # ----- the model -----

    def _key(self, items: list[Any], headers: dict[str, str]) -> str:
        run = headers.get(RUN_HEADER)
        if run:
            return f"run:{run}"
        session = headers.get("session-id")
        if session:
            return f"session:{session}"
        task = next(
            (
                _text(i.get("content"))
                for i in items
                if isinstance(i, dict) and _kind(i) == "message" and i.get("role") == "user"
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
        item_id = "rs_" + _hex(conv.key, conv.answers, label, size=32)
        # Opaque like the real thing: base64-ish, long, unique per item.
        blob = "gAAAAA" + "".join(_hex(item_id, n, size=64) for n in range(6))
        self.encrypted[item_id] = blob
        return {
            "id": item_id,
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": f"**Planning** {label}: I decide the next action."}],
            "encrypted_content": blob,
        }

    def _message(self, conv: Conversation, text: str, label: str) -> dict[str, Any]:
        return {
            "id": "msg_" + _hex(conv.key, conv.answers, label, size=32),
            "type": "message",
            "status": "completed",
            "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": text}],
            "role": "assistant",
        }

    def _call(self, conv: Conversation, name: str, arguments: str, label: str) -> dict[str, Any]:
        return {
            "id": "fc_" + _hex(conv.key, conv.answers, label, size=32),
            "type": "function_call",
            "status": "completed",
            "arguments": arguments,
            "call_id": "call_" + _hex(conv.key, label),
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

    def _check_reasoning(self, items: list[Any]) -> list[str]:
        problems = []
        for position, item in enumerate(items):
            if not isinstance(item, dict) or item.get("type") != "reasoning":
                continue
            item_id = item.get("id")
            emitted = self.encrypted.get(item_id) if isinstance(item_id, str) else None
            if emitted is None:
                problems.append(f"input[{position}]: reasoning item {item_id!r} was never emitted")
            elif item.get("encrypted_content") != emitted:
                got = item.get("encrypted_content")
                problems.append(
                    f"input[{position}]: reasoning item {item_id!r} came back with encrypted_content "
                    f"{str(got)[:40]!r}... (length {len(got) if isinstance(got, str) else None}), "
                    f"not the {len(emitted)} bytes emitted"
                )
        return problems

    def _check_followers(self, items: list[Any]) -> list[str]:
        """Reasoning items that came back followed by another item than the one that followed
        them in the answer that produced them (informational: the Responses API is documented
        to refuse a reasoning item without its following item; whether it accepts a different
        one is not)."""
        changes = []
        for position, item in enumerate(items):
            if not isinstance(item, dict) or item.get("type") != "reasoning":
                continue
            expected = self.followers.get(str(item.get("id")))
            following = items[position + 1] if position + 1 < len(items) else None
            got = following.get("id") if isinstance(following, dict) else None
            if expected is not None and got != expected:
                kind = following.get("type") if isinstance(following, dict) else None
                changes.append(
                    f"input[{position}]: reasoning {item.get('id')!r} is followed by {kind} {got!r}, "
                    f"not by {expected!r} that followed it in its answer"
                )
        return changes

    def _leaks(self, items: list[Any], follow_up: bool) -> list[str]:
        """``read_tool_output`` items in a request the client made (not a read follow-up round)."""
        if follow_up:
            return []
        read_ids = _read_call_ids(items) | self.read_calls
        leaks = [f"input[{p}]: a read_tool_output call" for p, i in enumerate(items) if _is_read(i)]
        leaks += [
            f"input[{p}]: a read_tool_output result"
            for p, i in enumerate(items)
            if isinstance(i, dict)
            and i.get("type") == "function_call_output"
            and i.get("call_id") in read_ids
        ]
        return leaks

    def _decide(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[Seen, Any]:
        """The record of a request and what to answer: output items, a ``Failure``, or an
        error body with its status."""
        items = _items(body)
        tools = body.get("tools")
        offered_read = any(
            isinstance(t, dict) and t.get("name") == READ_TOOL
            for t in (tools if isinstance(tools, list) else [])
        )
        handles = list(dict.fromkeys(HANDLE.findall(orjson.dumps(items).decode())))
        tokens = self.dialect.count(body, self.counter)
        limit = body.get("max_output_tokens")
        budget = tokens + (limit if isinstance(limit, int) else 0)
        follow_up = is_read_follow_up(items, self.read_calls)
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
            problems=protocol_problems(items),
            reasoning_problems=self._check_reasoning(items),
            follower_changes=self._check_followers(items),
            leaks=self._leaks(items, follow_up),
            request_kind=request_kind,
            body=body,
            headers=headers,
        )
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

    # ----- the wire -----

    def _usage(self, tokens: int, output: list[dict[str, Any]]) -> dict[str, Any]:
        reasoning = sum(64 for i in output if i.get("type") == "reasoning")
        text = "".join(
            _text(i.get("content")) + str(i.get("name") or "") + str(i.get("arguments") or "") for i in output
        )
        produced = self.counter.count_text(text) + reasoning
        return {
            "input_tokens": tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": produced,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": tokens + produced,
        }

    def _response(
        self, response_id: str, body: dict[str, Any], output: list[dict[str, Any]], usage: Any, status: str
    ) -> dict[str, Any]:
        reasoning: dict[str, Any] = body["reasoning"] if isinstance(body.get("reasoning"), dict) else {}
        text: dict[str, Any] = body["text"] if isinstance(body.get("text"), dict) else {}
        return {
            "id": response_id,
            "object": "response",
            "created_at": int(time.time()),
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "max_tool_calls": None,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": None,
            "prompt_cache_key": body.get("prompt_cache_key"),
            "reasoning": {"effort": reasoning.get("effort", "medium"), "summary": reasoning.get("summary")},
            "safety_identifier": None,
            "service_tier": "default",
            "store": body.get("store", True),
            "temperature": 1.0,
            "text": {"format": {"type": "text"}, "verbosity": text.get("verbosity", "medium")},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_logprobs": 0,
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": usage,
            "user": None,
            "metadata": body.get("metadata") or {},
        }

    def _events(
        self, response_id: str, body: dict[str, Any], output: list[dict[str, Any]], tokens: int
    ) -> list[bytes]:
        """The answer as OpenAI streams it."""
        payloads: list[dict[str, Any]] = []
        in_progress = self._response(response_id, body, [], None, "in_progress")
        payloads.append({"type": "response.created", "response": in_progress})
        payloads.append({"type": "response.in_progress", "response": in_progress})
        for index, item in enumerate(output):
            item_id = item["id"]
            base = {"item_id": item_id, "output_index": index}
            kind = item["type"]
            if kind == "reasoning":
                payloads.append(
                    {
                        "type": "response.output_item.added",
                        "output_index": index,
                        "item": {**item, "summary": []},
                    }
                )
                for summary_index, part in enumerate(item["summary"]):
                    at = {**base, "summary_index": summary_index}
                    payloads.append(
                        {
                            "type": "response.reasoning_summary_part.added",
                            **at,
                            "part": {"type": "summary_text", "text": ""},
                        }
                    )
                    for piece in _pieces(part["text"], 3):
                        payloads.append(
                            {"type": "response.reasoning_summary_text.delta", **at, "delta": piece}
                        )
                    payloads.append(
                        {"type": "response.reasoning_summary_text.done", **at, "text": part["text"]}
                    )
                    payloads.append({"type": "response.reasoning_summary_part.done", **at, "part": part})
            elif kind == "message":
                text = _text(item["content"])
                payloads.append(
                    {
                        "type": "response.output_item.added",
                        "output_index": index,
                        "item": {**item, "status": "in_progress", "content": []},
                    }
                )
                part = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
                at = {**base, "content_index": 0}
                payloads.append({"type": "response.content_part.added", **at, "part": part})
                for piece in _pieces(text, 4):
                    payloads.append(
                        {"type": "response.output_text.delta", **at, "delta": piece, "logprobs": []}
                    )
                payloads.append({"type": "response.output_text.done", **at, "text": text, "logprobs": []})
                payloads.append({"type": "response.content_part.done", **at, "part": {**part, "text": text}})
            else:  # function_call
                payloads.append(
                    {
                        "type": "response.output_item.added",
                        "output_index": index,
                        "item": {**item, "status": "in_progress", "arguments": ""},
                    }
                )
                for piece in _pieces(item["arguments"], 5):
                    payloads.append(
                        {"type": "response.function_call_arguments.delta", **base, "delta": piece}
                    )
                payloads.append(
                    {"type": "response.function_call_arguments.done", **base, "arguments": item["arguments"]}
                )
            payloads.append({"type": "response.output_item.done", "output_index": index, "item": item})
        completed = self._response(response_id, body, output, self._usage(tokens, output), "completed")
        payloads.append({"type": "response.completed", "response": completed})
        return [
            b"event: "
            + str(p["type"]).encode()
            + b"\ndata: "
            + orjson.dumps({**p, "sequence_number": n})
            + b"\n\n"
            for n, p in enumerate(payloads)
        ]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/")
        headers = {k.lower(): v for k, v in request.headers.items()}
        if path == "/v1/models" and request.method == "GET":
            return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})
        if path != "/v1/responses" or request.method != "POST":
            with self._lock:
                self.others.append((request.method, request.path, headers))
            return web.json_response(
                {"error": {"message": "Unknown route.", "type": "invalid_request_error", "code": None}},
                status=404,
            )
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return web.json_response(
                invalid_request("We could not parse the JSON body of your request."), status=400
            )
        if not isinstance(body, dict):
            return web.json_response(invalid_request("The body must be a JSON object."), status=400)
        with self._lock:
            seen, answer = self._decide(body, headers)
            self.requests.append(seen)
        request_id = "req_" + _hex(seen.index, seen.conversation, size=32)
        base_headers = {
            "x-request-id": request_id,
            "openai-processing-ms": "5",
            "openai-version": "2020-10-01",
        }
        if isinstance(answer, tuple):
            status, error = answer
            return web.json_response(error, status=status, headers=base_headers)
        response_id = "resp_" + request_id[4:]
        sse_headers = {
            **base_headers,
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-cache",
        }
        if isinstance(answer, Failure):
            if answer.kind == "status":
                extra = (
                    {"retry-after": "0", "x-ratelimit-remaining-requests": "0"}
                    if answer.status == 429
                    else {}
                )
                return web.json_response(
                    answer.error_body(), status=answer.status, headers={**base_headers, **extra}
                )
            if not seen.stream:
                assert request.transport is not None
                request.transport.abort()
                raise asyncio.CancelledError
            # A reset in the middle of the stream of the answer the round would have had.
            with self._lock:
                conv = self.conversations[seen.conversation]
                ghost = Conversation(conv.key, step=conv.step, answers=conv.answers)
                _, planned = self._next_step(ghost, body.get("tools"))
            response = web.StreamResponse(status=200, headers=sse_headers)
            await response.prepare(request)
            for data in self._events(response_id, body, planned, seen.tokens)[: answer.after_events]:
                await response.write(data)
            await asyncio.sleep(0.05)
            assert request.transport is not None
            request.transport.abort()
            return response
        seen.output = answer
        with self._lock:
            for item, following in itertools.pairwise(answer):
                if item.get("type") == "reasoning":
                    self.followers[item["id"]] = following["id"]
        if not seen.stream:
            usage = self._usage(seen.tokens, answer)
            return web.json_response(
                self._response(response_id, body, answer, usage, "completed"), headers=base_headers
            )
        response = web.StreamResponse(status=200, headers=sse_headers)
        await response.prepare(request)
        for data in self._events(response_id, body, answer, seen.tokens):
            await response.write(data)
        await response.write_eof()
        return response

    def start(self) -> ResponsesUpstream:
        self.counter.warm_up()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            app = web.Application(client_max_size=1024**3)
            app.router.add_route("*", "/{tail:.*}", self._handle)
            self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
            loop.run_until_complete(self._runner.setup())
            self.port = free_port()
            site = web.TCPSite(self._runner, "127.0.0.1", self.port)
            loop.run_until_complete(site.start())
            self._started.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name="responses-upstream", daemon=True)
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("responses upstream did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)


def _is_read(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type") == "function_call" and item.get("name") == READ_TOOL
