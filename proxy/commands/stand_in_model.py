"""The demo's stand-in model: a tiny local server speaking OpenAI Chat Completions.

It plays the model of the scripted session (``demo_session.SCRIPT``) so that ``demo`` needs no
key and no network, and it behaves the way a provider does where compaction matters:

- it enforces its context window: a request whose prompt tokens plus its ``max_tokens`` exceed
  it gets OpenAI's own HTTP 400 ``context_length_exceeded`` body;
- it reports ``usage`` with the prompt tokens it counted (o200k, the proxy's own encoding for a
  model of unknown name, so the two agree);
- it answers with tool calls, and when the proxy offers ``read_tool_output`` at the step the
  script reads, it searches the saved outputs, like a model checking what it was told.

It decides from the request alone (stateless, deterministic): the last step done is the
number in the id of the newest ``call_step_N`` call the messages hold, which the proxy keeps in
the verbatim tail however much it compacts. What it saw is recorded for the demo to show.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson

from policies.tokens import TokenCounter
from proxy.commands.demo_session import FINAL_ANSWER, SCRIPT, Step

MODEL = "stand-in-coder"
READ_TOOL = "read_tool_output"
# The step after which the model reads saved outputs back: before the suite's next run it
# checks what failed along the way (those test runs are offloaded by then).
READ_AFTER_STEP = 37
READ_THOUGHT = (
    "Before the next full run, check every test that failed along the way: those outputs were "
    "saved outside the context, so search them all for FAILED lines."
)
# ``*`` searches every saved output of the conversation at once (the tool's own schema says so).
READ_ARGUMENTS = {"handle": "*", "pattern": "^FAILED"}
_STEP_ID = re.compile(r"call_step_(\d+)")


def context_length_error(window: int, prompt: int, completion: int) -> dict[str, Any]:
    """OpenAI's answer (HTTP 400) to a request over the model's window, as its API words it."""
    return {
        "error": {
            "message": (
                f"This model's maximum context length is {window} tokens. However, you requested "
                f"{prompt + completion} tokens ({prompt} in the messages, {completion} in the "
                "completion). Please reduce the length of the messages or completion."
            ),
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


def _error(message: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}


@dataclass(frozen=True)
class Seen:
    """One request as the stand-in received it."""

    index: int
    kind: str  # step, read, final, rejected, invalid
    step: int
    messages: int
    prompt_tokens: int
    status: int


@dataclass(frozen=True)
class ReadBack:
    """A ``read_tool_output`` call of the model and what the proxy answered it."""

    arguments: dict[str, Any]
    result: str


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def _calls(messages: list[Any]) -> dict[str, dict[str, Any]]:
    """Every tool call of the assistant messages, by id."""
    found: dict[str, dict[str, Any]] = {}
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "assistant":
            for call in message.get("tool_calls") or []:
                if isinstance(call, dict) and isinstance(call.get("id"), str):
                    found[call["id"]] = call
    return found


def last_step(messages: list[Any]) -> int:
    """The newest step the messages hold a call of (0: none yet)."""
    steps = [int(m.group(1)) for call_id in _calls(messages) if (m := _STEP_ID.fullmatch(call_id))]
    return max(steps, default=0)


@dataclass
class StandInModel:
    """The model, without the server around it: ``answer`` takes a request body and returns
    the HTTP status and the JSON body a provider would."""

    window: int
    model: str = MODEL
    script: list[Step] = field(default_factory=lambda: SCRIPT)
    read_after_step: int = READ_AFTER_STEP
    counter: TokenCounter = field(default_factory=TokenCounter)
    seen: list[Seen] = field(default_factory=list)
    reads: list[ReadBack] = field(default_factory=list)
    last_messages: list[Any] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def answer(self, body: Any) -> tuple[int, dict[str, Any]]:
        with self._lock:
            return self._answer(body)

    def _record(self, kind: str, step: int, messages: int, tokens: int, status: int) -> None:
        self.seen.append(Seen(len(self.seen), kind, step, messages, tokens, status))

    def _answer(self, body: Any) -> tuple[int, dict[str, Any]]:
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list) or not messages or body.get("stream") is True:
            self._record("invalid", 0, 0, 0, 400)
            return 400, _error("The stand-in model answers non-streamed chat requests with messages only.")
        tokens = self.counter.count_request(body).total
        reserve = body.get("max_completion_tokens") or body.get("max_tokens") or 0
        reserve = reserve if isinstance(reserve, int) else 0
        if tokens + reserve > self.window:
            self._record("rejected", last_step(messages), len(messages), tokens, 400)
            return 400, context_length_error(self.window, tokens, reserve)
        self.last_messages = messages
        kind, step, content, call = self._decide(body, messages)
        self._record(kind, step, len(messages), tokens, 200)
        return 200, self._completion(content, call, tokens)

    def _decide(
        self, body: dict[str, Any], messages: list[Any]
    ) -> tuple[str, int, str, dict[str, Any] | None]:
        """The next move: (kind, step, the answer's text, its tool call or None)."""
        done = last_step(messages)
        last = messages[-1] if isinstance(messages[-1], dict) else {}
        calls = _calls(messages)
        answering = calls.get(str(last.get("tool_call_id")), {}) if last.get("role") == "tool" else {}
        read_done = (answering.get("function") or {}).get("name") == READ_TOOL
        if read_done:
            arguments = orjson.loads((answering.get("function") or {}).get("arguments") or "{}")
            self.reads.append(ReadBack(arguments, _text(last.get("content"))))
        offered = any(
            isinstance(tool, dict) and (tool.get("function") or {}).get("name") == READ_TOOL
            for tool in body.get("tools") or []
        )
        if done == self.read_after_step and offered and not read_done and body.get("tool_choice") != "none":
            arguments = READ_ARGUMENTS
            call = {"id": f"call_read_{done:02d}", "name": READ_TOOL, "arguments": orjson.dumps(arguments)}
            return "read", done, READ_THOUGHT, call
        if done >= len(self.script):
            return "final", done, FINAL_ANSWER, None
        step = self.script[done]
        call = {"id": f"call_step_{done + 1:02d}", "name": step.tool, "arguments": step.arguments_json()}
        return "step", done + 1, step.thought, call

    def _completion(self, content: str, call: dict[str, Any] | None, prompt: int) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if call is not None:
            arguments = call["arguments"]
            arguments = arguments.decode() if isinstance(arguments, bytes) else arguments
            function = {"name": call["name"], "arguments": arguments}
            message["tool_calls"] = [{"id": call["id"], "type": "function", "function": function}]
        said = content + (message["tool_calls"][0]["function"]["arguments"] if call else "")
        completion = self.counter.count_text(said, "o200k_base")
        return {
            "id": f"chatcmpl-standin-{len(self.seen):04d}",
            "object": "chat.completion",
            "created": 1_700_000_000 + len(self.seen),
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if call else "stop"}],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }


class StandInServer:
    """``StandInModel`` on a free loopback port, served from a thread of this process."""

    def __init__(self, model: StandInModel) -> None:
        self.model = model
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(model))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="stand-in-model", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> StandInServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def _handler(model: StandInModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # Keep-alive, as providers do: the proxy's pooled client reuses its connection.
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": model.model, "object": "model"}]})
            else:
                self._send(404, _error(f"Unknown route GET {self.path}.", "unknown_url"))

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._send(404, _error(f"Unknown route POST {self.path}.", "unknown_url"))
                return
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError:
                self._send(400, _error("We could not parse the JSON body of your request."))
                return
            self._send(*model.answer(body))

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = orjson.dumps(body)
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.send_header("x-request-id", f"req_standin_{len(model.seen):04d}")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the demo prints what matters."""

    return Handler
