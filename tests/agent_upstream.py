"""A fake OpenAI Chat Completions server that plays the MODEL of an agent loop.

Unlike ``FakeUpstream`` (replies queued by the test), this server decides each answer from
the request, deterministically, the way a model driving a real agent would:

- it works through ``steps`` steps, one call of the client's own tool per step (arguments
  that make the client produce a large output), then gives a final answer;
- it enforces a context window like OpenAI: a request whose prompt tokens (the project's own
  counter, o200k) plus ``max_tokens``/``max_completion_tokens`` exceed ``window`` gets
  OpenAI's real 400 ``context_length_exceeded`` answer;
- it checks the tool-call protocol of every request it receives and records each problem;
- when the proxy offers ``read_tool_output`` and the messages name a saved output
  (``handle=out_...``), it reads one now and then (``read_every`` steps) before going on;
  the proxy answers that call itself and asks again (a *read follow-up round*);
- it fails a chosen read follow-up round on demand: an HTTP error status, or a connection
  reset in the middle of the stream;
- it streams exactly like OpenAI (``chat.completion.chunk`` events, tool calls as deltas,
  a finishing chunk, a usage-only chunk when ``stream_options.include_usage``, ``[DONE]``).

Agents without tools (text actions, e.g. mini-swe-agent's text mode) get a THOUGHT line and
one fenced action block per step, and a final step with a submission command.

The state of each conversation is keyed by the client's ``X-Agent-Run`` header when it sends
one (a run marker that survives anything the proxy does to the messages), else by its first
user message; never by message counts, since the proxy removes and summarizes old messages.
Each request also records whether its first user message is still the task as first sent.
Like ``FakeUpstream``, it runs in a thread with its own event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from aiohttp import web

from policies.tokens import TokenCounter
from tests.fake_upstream import free_port

READ_TOOL = "read_tool_output"
HANDLE = re.compile(r"handle=(out_[0-9a-f]+)")
DONE_PREFIX = "DONE:"
STEP_MARK = "AGENT-STEP"
RUN_HEADER = "x-agent-run"


def context_length_error(window: int, tokens: int) -> dict[str, Any]:
    """OpenAI's own answer to a request over the model's context window (HTTP 400)."""
    return {
        "error": {
            "message": (
                f"This model's maximum context length is {window} tokens. However, your messages "
                f"resulted in {tokens} tokens. Please reduce the length of the messages."
            ),
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


def server_error() -> dict[str, Any]:
    return {
        "error": {
            "message": "The server had an error while processing your request. Sorry about that!",
            "type": "server_error",
            "param": None,
            "code": None,
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
    """How to fail a read follow-up round.

    ``status``: answer ``status`` with an OpenAI error body (500 ``server_error``, 429
    ``rate_limit_exceeded``, or ``body``). ``reset``: start the answer, send ``after_chunks``
    SSE events of it (a streamed request) and cut the connection; a non-streamed request is cut
    before any byte of the answer.
    """

    kind: Literal["status", "reset"] = "status"
    status: int = 500
    body: dict[str, Any] | None = None
    after_chunks: int = 2

    def error_body(self) -> dict[str, Any]:
        if self.body is not None:
            return self.body
        return rate_limit_error() if self.status == 429 else server_error()


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


@dataclass
class Conversation:
    key: str
    step: int = 0  # steps issued to the client (its own tool calls or text actions)
    finished: bool = False
    reads: int = 0  # read_tool_output calls made
    last_read_step: int = 0  # the step count when the last read was made
    task: str | None = None  # the first user message of its first request


@dataclass(repr=False)
class Seen:
    """One chat request as the fake received it, and what it did with it."""

    index: int
    conversation: str
    tokens: int  # prompt tokens
    budget: int  # prompt tokens + max_tokens / max_completion_tokens
    stream: bool
    kind: str  # rejected, step, final, read, failed, stray, no_tools
    step: int
    offered_read: bool
    read_follow_up: bool
    handles: list[str]
    problems: list[str]
    task_kept: bool  # the first user message is the conversation's task, verbatim
    body: dict[str, Any]
    headers: dict[str, str]

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


def protocol_problems(messages: list[Any]) -> list[str]:
    """Tool-call protocol problems of a message list: every assistant tool call is answered
    by a ``tool`` message before the next non-tool message, and no ``tool`` message answers
    a call that was not made (or was answered already)."""
    problems: list[str] = []
    pending: dict[str, str] = {}  # call id -> tool name, of the last assistant message
    answered: set[str] = set()
    for position, message in enumerate(messages):
        if not isinstance(message, dict):
            problems.append(f"message {position} is not an object")
            continue
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or call_id not in pending:
                where = "answered twice" if call_id in answered else "without a matching earlier call"
                problems.append(f"message {position}: tool result {call_id!r} {where}")
            else:
                del pending[call_id]
                answered.add(call_id)
            continue
        if pending:
            problems.append(
                f"message {position} ({role}): tool call(s) {sorted(pending)} not answered before it"
            )
            pending = {}
        if role == "assistant":
            for call in message.get("tool_calls") or []:
                call_id = call.get("id") if isinstance(call, dict) else None
                if not isinstance(call_id, str) or not call_id:
                    problems.append(f"message {position}: a tool call without an id")
                    continue
                if call_id in answered or call_id in pending:
                    problems.append(f"message {position}: tool call id {call_id!r} used twice")
                function = call.get("function") or {}
                pending[call_id] = str(function.get("name"))
    if pending:
        problems.append(f"the request ends with unanswered tool call(s) {sorted(pending)}")
    return problems


def _calls_by_id(messages: list[Any]) -> dict[str, str]:
    names: dict[str, str] = {}
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "assistant":
            for call in message.get("tool_calls") or []:
                if isinstance(call, dict) and isinstance(call.get("id"), str):
                    names[call["id"]] = str((call.get("function") or {}).get("name"))
    return names


def is_read_follow_up(messages: list[Any]) -> bool:
    """The request ends with the result of a ``read_tool_output`` call: the proxy asks again
    after answering a read."""
    names = _calls_by_id(messages)
    for message in reversed(messages):
        if not isinstance(message, dict) or message.get("role") != "tool":
            return False
        if names.get(str(message.get("tool_call_id"))) == READ_TOOL:
            return True
    return False


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


class AgentUpstream:
    """The scripted model. Options:

    ``window``: the context window enforced (tokens). ``steps``: client tool steps before the
    final answer. ``read_every``: make a ``read_tool_output`` call (when offered and a handle
    is named) once at least this many steps passed since the last read; 0 never reads.
    ``read_arguments``: the read arguments, in turn (the handle is added).
    ``read_preamble``: text streamed before a read call in the same answer.
    ``fail_read_follow_up``: fail the N-th read follow-up round (1-based, counted over the
    server's life) as ``failure`` says. ``final_command``: finish with this command (a call
    of the shell tool, or a text action) instead of a plain ``DONE:`` answer.
    ``action_fence``: the fence language of text actions. ``output_lines``: lines each step's
    command prints.
    """

    def __init__(
        self,
        *,
        window: int = 6000,
        steps: int = 30,
        read_every: int = 3,
        read_arguments: list[dict[str, Any]] | None = None,
        read_preamble: str | None = None,
        fail_read_follow_up: int | None = None,
        failure: Failure | None = None,
        final_command: str | None = None,
        action_fence: str = "bash",
        output_lines: int = 90,
        model: str = "agent-model",
    ) -> None:
        self.window = window
        self.steps = steps
        self.read_every = read_every
        self.read_arguments = read_arguments or [{"num_lines": 40}, {"pattern": "ERROR"}]
        self.read_preamble = read_preamble
        self.fail_read_follow_up = fail_read_follow_up
        self.failure = failure or Failure()
        self.final_command = final_command
        self.action_fence = action_fence
        self.output_lines = output_lines
        self.model = model
        self.counter = TokenCounter()
        self.requests: list[Seen] = []
        self.conversations: dict[str, Conversation] = {}
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
    def task_not_kept(self) -> list[Seen]:
        """Requests whose first user message is not the conversation's task as first sent."""
        return [s for s in self.requests if not s.task_kept]

    @property
    def reads(self) -> list[Seen]:
        return [s for s in self.requests if s.kind == "read"]

    @property
    def follow_ups(self) -> list[Seen]:
        return [s for s in self.requests if s.read_follow_up]

    def conversation(self) -> Conversation:
        """The only conversation (tests run one agent run per server)."""
        assert len(self.conversations) == 1, f"expected one conversation, saw {list(self.conversations)}"
        return next(iter(self.conversations.values()))

    def summary(self) -> str:
        """One line per request, for assertion messages."""
        return "\n".join(
            f"#{s.index} {s.kind} step={s.step} tokens={s.tokens} budget={s.budget} stream={s.stream} "
            f"read_offered={s.offered_read} follow_up={s.read_follow_up} problems={len(s.problems)}"
            + ("" if s.task_kept else " TASK-NOT-VERBATIM")
            for s in self.requests
        )

    # ----- the model -----

    @staticmethod
    def _task(messages: list[Any]) -> str:
        return next(
            (_text(m.get("content")) for m in messages if isinstance(m, dict) and m.get("role") == "user"), ""
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
            return orjson.dumps({"command": command or shell_command(step, self.output_lines)}).decode()
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
        return "step", Answer(content=self._text_action(thought, shell_command(step, self.output_lines)))

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
            arguments = {"handle": handles[-1], **self.read_arguments[conv.reads % len(self.read_arguments)]}
            conv.reads += 1
            conv.last_read_step = conv.step
            seen.kind, seen.step = "read", conv.step
            call = Call(
                self._call_id(conv.key, f"read-{conv.reads}"), READ_TOOL, orjson.dumps(arguments).decode()
            )
            return seen, Answer(content=self.read_preamble, calls=[call])
        kind, answer = self._next_step(conv, tools, body)
        seen.kind, seen.step = kind, conv.step
        return seen, answer

    # ----- the wire -----

    def _usage(self, prompt: int, answer: Answer) -> dict[str, Any]:
        text = (answer.content or "") + "".join(c.name + c.arguments for c in answer.calls)
        completion = self.counter.count_text(text) + 3 * len(answer.calls)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }

    def _completion(self, completion_id: str, prompt: int, answer: Answer) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": answer.content,
            "refusal": None,
            "annotations": [],
        }
        if answer.calls:
            message["tool_calls"] = [c.as_message_part() for c in answer.calls]
        return {
            "id": completion_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": answer.finish_reason}
            ],
            "usage": self._usage(prompt, answer),
            "service_tier": "default",
            "system_fingerprint": "fp_agent_upstream",
        }

    def _chunks(self, completion_id: str, prompt: int, answer: Answer, include_usage: bool) -> list[bytes]:
        created = int(time.time())

        def event(choices: list[Any], usage: Any = None) -> bytes:
            data: dict[str, Any] = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.model,
                "service_tier": "default",
                "system_fingerprint": "fp_agent_upstream",
                "choices": choices,
            }
            if include_usage:
                data["usage"] = usage
            return b"data: " + orjson.dumps(data) + b"\n\n"

        def delta(part: dict[str, Any], finish: str | None = None) -> bytes:
            return event([{"index": 0, "delta": part, "logprobs": None, "finish_reason": finish}])

        out = [delta({"role": "assistant", "content": "", "refusal": None})]
        for piece in _pieces(answer.content or "", 4):
            out.append(delta({"content": piece}))
        for index, call in enumerate(answer.calls):
            out.append(
                delta(
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": call.id,
                                "type": "function",
                                "function": {"name": call.name, "arguments": ""},
                            }
                        ]
                    }
                )
            )
            for piece in _pieces(call.arguments, 5):
                out.append(delta({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
        out.append(delta({}, answer.finish_reason))
        if include_usage:
            out.append(event([], self._usage(prompt, answer)))
        out.append(b"data: [DONE]\n\n")
        return out

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.path.rstrip("/") == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})
        if request.path.rstrip("/") != "/v1/chat/completions" or request.method != "POST":
            return web.json_response(
                {"error": {"message": "Unknown route.", "type": "invalid_request_error", "code": None}},
                status=404,
            )
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return web.json_response(
                {"error": {"message": "We could not parse the JSON body of your request.", "type": "x"}},
                status=400,
            )
        headers = {k.lower(): v for k, v in request.headers.items()}
        with self._lock:
            seen, answer = self._decide(body, headers)
            self.requests.append(seen)
        request_id = "req_" + hashlib.sha256(f"{seen.index}/{seen.conversation}".encode()).hexdigest()[:24]
        base_headers = {"x-request-id": request_id, "openai-processing-ms": "5"}
        if answer is None:
            return web.json_response(
                context_length_error(self.window, seen.tokens), status=400, headers=base_headers
            )
        completion_id = "chatcmpl-" + request_id[4:]
        if isinstance(answer, Failure):
            if answer.kind == "status":
                extra = {"retry-after": "0"} if answer.status == 429 else {}
                return web.json_response(
                    answer.error_body(), status=answer.status, headers={**base_headers, **extra}
                )
            if not seen.stream:
                assert request.transport is not None
                request.transport.abort()
                raise asyncio.CancelledError
            # A reset in the middle of the stream that would have carried the next step.
            conv = self.conversations[seen.conversation]
            _, planned = self._next_step(Conversation(conv.key, step=conv.step), body.get("tools"), body)
            chunks = self._chunks(completion_id, seen.tokens, planned, include_usage=False)
            response = web.StreamResponse(
                status=200,
                headers={**base_headers, "content-type": "text/event-stream", "cache-control": "no-cache"},
            )
            await response.prepare(request)
            for data in chunks[: answer.after_chunks]:
                await response.write(data)
            await asyncio.sleep(0.05)
            assert request.transport is not None
            request.transport.abort()
            return response
        if not seen.stream:
            return web.json_response(
                self._completion(completion_id, seen.tokens, answer), headers=base_headers
            )
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        response = web.StreamResponse(
            status=200,
            headers={**base_headers, "content-type": "text/event-stream", "cache-control": "no-cache"},
        )
        await response.prepare(request)
        for data in self._chunks(completion_id, seen.tokens, answer, include_usage):
            await response.write(data)
        await response.write_eof()
        return response

    def start(self) -> AgentUpstream:
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

        self._thread = threading.Thread(target=run, name="agent-upstream", daemon=True)
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("agent upstream did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)


def _pieces(text: str, count: int) -> list[str]:
    """``text`` split into about ``count`` pieces (none when empty)."""
    if not text:
        return []
    size = max(1, -(-len(text) // count))
    return [text[i : i + size] for i in range(0, len(text), size)]
