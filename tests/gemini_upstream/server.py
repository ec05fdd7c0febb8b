"""``GeminiUpstream``: the fake Gemini API and Code Assist server (see the package docstring)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from tests.fake_upstream import LoopbackServer
from tests.gemini_protocol import call_key, calls_of, current_turn, problems, signature_problems
from tests.gemini_upstream import wire
from tests.gemini_upstream.agent import (
    READ_TOOL,
    Plan,
    Run,
    ScriptedModel,
    handles,
    is_read_follow_up,
    offers_read,
)
from tests.gemini_upstream.agent import run_key as key_of_run
from tests.gemini_upstream.tokens import GeminiTokenizer

_METHODS = (":generateContent", ":streamGenerateContent", ":countTokens")


@dataclass
class Seen:
    """One ``generateContent`` request as the fake received and judged it."""

    index: int
    path: str
    query: str
    headers: dict[str, str]
    body: dict[str, Any]  # the generateContent request (Code Assist's unwrapped)
    model: str
    stream: bool
    tokens: int
    run: str = ""
    kind: str = ""  # step, read, final, summary; refused (over the window), invalid, unauthorized
    status: int = 200
    error: str | None = None
    offered_read: bool = False
    read_follow_up: bool = False
    handles: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    signature_problems: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    parts: list[dict[str, Any]] = field(default_factory=list)  # the answer's


def leaks(contents: list[Any]) -> list[str]:
    """``read_tool_output`` calls outside the proxy's read rounds (which it appends last: from
    the first read call on, every model content calls it and every user content answers)."""
    first = next(
        (i for i, c in enumerate(contents) if any(x.get("name") == READ_TOOL for x in calls_of(c))), None
    )
    if first is None:
        return []
    rounds = contents[first:]
    if all(c.get("role") == ("model" if i % 2 == 0 else "user") for i, c in enumerate(rounds)):
        return []
    return [f"contents[{first}]: a read_tool_output call the client's history holds"]


class GeminiUpstream:
    """The fake. Options: ``window`` (the input token limit: a larger prompt gets the API's own
    400), ``steps`` (client tool calls before the final answer), ``read_every`` (read a named
    saved output when offered, at most every this many steps; 0 never), ``read_arguments``,
    ``output_lines`` (lines each step's command prints), ``call_ids`` (calls carry an ``id``),
    ``strict`` (refuse protocol and signature problems with the API's 400; else record and
    answer), ``api_key`` (another key, in ``x-goog-api-key`` or ``?key=``, gets the API's 400
    ``API_KEY_INVALID``), ``factor`` (the tokenizer's over o200k)."""

    def __init__(
        self,
        *,
        window: int = 1_048_576,
        steps: int = 10,
        read_every: int = 1,
        read_arguments: dict[str, Any] | None = None,
        output_lines: int = 90,
        call_ids: bool = False,
        strict: bool = True,
        api_key: str | None = None,
        factor: float = 1.1,
    ) -> None:
        self.window = window
        self.strict = strict
        self.api_key = api_key
        self.model = ScriptedModel(
            steps=steps,
            read_every=read_every,
            output_lines=output_lines,
            call_ids=call_ids,
            read_arguments=read_arguments or {"num_lines": 40},
        )
        self.tokenizer = GeminiTokenizer(factor)
        self.requests: list[Seen] = []
        self.others: list[tuple[str, str]] = []  # (method, path) of any other route
        self.counted: list[tuple[dict[str, Any], int]] = []  # what countTokens was asked, and said
        self.runs: dict[str, Run] = {}
        self.emitted: dict[str, dict[str, Any]] = {}  # signature -> the part it came on
        self.signed_calls: dict[str, str] = {}  # the signed calls' (name, args) -> signature
        self.port = 0
        self._lock = threading.Lock()
        self._server: LoopbackServer | None = None

    @property
    def base_url(self) -> str:
        """For ``GOOGLE_GEMINI_BASE_URL``, ``gemini.base_url`` and ``CODE_ASSIST_ENDPOINT``."""
        return f"http://127.0.0.1:{self.port}"

    def count(self, body: dict[str, Any]) -> int:
        return self.tokenizer.count(body)

    # ----- the decision -----

    def _judge(self, seen: Seen) -> tuple[int, dict[str, Any]] | Plan:
        body, headers = seen.body, seen.headers
        key = headers.get("x-goog-api-key") or _query_key(seen.query)
        if seen.path.startswith("/v1internal"):
            key = headers.get("authorization", "").removeprefix("Bearer ")
        if self.api_key is not None and key != self.api_key:
            seen.kind, seen.status = "unauthorized", 400
            return 400, wire.bad_key()
        contents = body.get("contents") if isinstance(body.get("contents"), list) else []
        seen.problems = problems(body)
        seen.signature_problems = signature_problems(body, self.emitted, self.signed_calls)
        seen.leaks = leaks(contents)
        seen.offered_read, seen.read_follow_up = offers_read(body), is_read_follow_up(body)
        seen.handles = handles(body)
        if seen.tokens > self.window:
            seen.kind, seen.status = "refused", 400
            return 400, wire.too_many_tokens(seen.tokens, self.window)
        found = [*seen.problems, *seen.signature_problems]
        if self.strict and found:
            seen.kind, seen.status, seen.error = "invalid", 400, found[0]
            return 400, wire.error_body(400, f"Request contains an invalid argument: {found[0]}")
        seen.run = key_of_run(body, headers)
        run = self.runs.get(seen.run) or Run(seen.run)
        plan = self.model.plan(run, body)
        self.runs[seen.run] = plan.after
        self.emitted |= plan.signed
        for mark, part in plan.signed.items():
            if "functionCall" in part:
                self.signed_calls[call_key(part["functionCall"])] = mark
        seen.kind, seen.parts = plan.kind, plan.parts
        return plan

    # ----- the wire -----

    async def _generate(self, request: web.Request, code_assist: bool) -> web.StreamResponse:
        raw = await request.read()
        try:
            outer = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return _json(400, wire.error_body(400, "Invalid JSON payload received."))
        body = outer.get("request") if code_assist and isinstance(outer, dict) else outer
        if not isinstance(body, dict):
            return _json(400, wire.error_body(400, "Invalid JSON payload received."))
        path = request.path
        model = str(outer.get("model")) if code_assist else path.split("/models/", 1)[-1].split(":", 1)[0]
        stream = path.endswith(":streamGenerateContent")
        headers = {k.lower(): v for k, v in request.headers.items()}
        with self._lock:
            seen = Seen(
                len(self.requests), path, request.query_string, headers, body, model, stream, self.count(body)
            )
            decided = self._judge(seen)
            self.requests.append(seen)
        if not isinstance(decided, Plan):
            return _json(*decided)
        use = wire.usage(seen.tokens, self.tokenizer.output(decided.parts))
        envelope = "response" if code_assist else None
        rid = f"resp-{seen.index}"
        if not stream:
            answer = wire.response(decided.parts, use, model, rid)
            return _json(200, {"response": answer} if code_assist else answer)
        if request.query.get("alt") != "sse":  # a JSON array, as the API streams without alt=sse
            chunks = [orjson.loads(e[6:]) for e in wire.events(decided.parts, use, model, rid, envelope)]
            return _json(200, chunks)
        response = web.StreamResponse(status=200, headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for event in wire.events(decided.parts, use, model, rid, envelope):
            await response.write(event)
        await response.write_eof()
        return response

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if request.method == "POST" and path.startswith("/v1internal:"):
            return await self._generate(request, code_assist=True)
        if request.method == "POST" and path.startswith("/v1beta/models/") and path.endswith(_METHODS[:2]):
            return await self._generate(request, code_assist=False)
        with self._lock:
            self.others.append((request.method, request.path_qs))
        if request.method == "POST" and path.endswith(":countTokens"):
            body = orjson.loads(await request.read())
            inner = body.get("generateContentRequest") or body
            if set(body) - {"contents", "generateContentRequest"}:
                return _json(
                    400, wire.error_body(400, f"Invalid JSON payload received. Unknown name {sorted(body)}")
                )
            tokens = self.count(inner)
            with self._lock:
                self.counted.append((inner, tokens))
            return _json(200, {"totalTokens": tokens})
        if request.method == "GET" and path.startswith("/v1beta/models/"):
            name = path.removeprefix("/v1beta/")
            return _json(200, {"name": name, "inputTokenLimit": self.window, "outputTokenLimit": 65_536})
        return _json(404, wire.error_body(404, f"Method not found: {path}"))

    # ----- life -----

    def start(self) -> GeminiUpstream:
        self.tokenizer.warm_up()
        self._server = LoopbackServer(self._handle, "gemini-upstream")
        self.port = self._server.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()

    def __enter__(self) -> GeminiUpstream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----- what tests read back -----

    def main_requests(self) -> list[Seen]:
        """The requests of the runs (not refused, not the agent's own compression)."""
        return [s for s in self.requests if s.kind in ("step", "read", "final")]

    def in_turn(self, seen: Seen) -> int:
        return current_turn(seen.body.get("contents") or [])


def _query_key(query: str) -> str | None:
    for pair in query.split("&"):
        name, _, value = pair.partition("=")
        if name == "key":
            return value
    return None


def _json(status: int, payload: Any) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(payload), content_type="application/json")
