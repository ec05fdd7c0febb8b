"""The recorded upstream: the API the proxy forwards to during a replay.

It answers each request with the recorded next assistant message, so a whole trajectory
replays offline and never diverges from the recording, and it looks at what it received (the
arm's view, in enforce mode): protocol problems, message digests for prefix stability, and
at question points the whole view for the evidence check. Question requests of model arms
are forwarded to the answering model instead.

Requests are matched to what the harness expects by the ``X-Replay-Ticket`` header, which the
proxy relays like any other client header (also on its own read_tool_output rounds). A request's
door (and a Gemini door's model, in its path) is found with the proxy's own door table: one
server is the upstream of every provider (OpenAI's and Anthropic's at ``base_url``, Google's at
``root_url``).
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from aiohttp import web

from policies.conversation import Message, parse
from policies.tokens import REPLY_PRIMING, TokenCounter
from proxy.dialects import DoorTable, Target
from proxy.dialects.base import Parsed
from replay.config import ModelEndpoint
from replay.session.cost import SessionLog
from replay.session.doors import REPLAY_DOORS, adapter, answer, chat_request, read, tool_names
from replay.session.reader import Reader
from replay.session.survival import view_text

TICKET_HEADER = "X-Replay-Ticket"
SESSION_HEADER = "x-session-id"
# The doors the recorded upstream answers, found as the proxy finds them.
_DOOR_TABLE = DoorTable(REPLAY_DOORS)
# Session logs kept at most (the oldest dropped first): a replayer takes each one when its
# case is done, so only sessions in flight are held.
MAX_SESSIONS = 256


def message_digest(message: Any) -> bytes:
    return hashlib.blake2b(orjson.dumps(message), digest_size=12).digest()


@dataclass(slots=True)
class Received:
    """One request as the upstream received it."""

    messages: list[Message] | None  # kept only when the ticket asks for it
    message_count: int
    digests: tuple[bytes, ...]
    problems: tuple[str, ...]
    tool_names: tuple[str, ...]
    tokens: tuple[int, ...] = ()  # per message, as counted for the cost simulation
    # Where the view's tail starts (its newest step with output): between compaction points
    # the next view may change only from there (``Conversation.tail_start``).
    tail_start: int = 0


def request_kind(ticket: Ticket) -> str:
    """What a request is, for ``replay.session.cost``: asked before the request joins the ticket."""
    if ticket.keep_messages:
        return "question"
    kind = "answer" if ticket.reply is None else "step"
    return kind + "_read" if ticket.received else kind


@dataclass(slots=True)
class Ticket:
    reply: Message | None = None  # the recorded answer; None: forward to `forward`
    forward: ModelEndpoint | None = None
    keep_messages: bool = False
    # A question point answered by the scripted reader: it reads saved outputs through the
    # proxy before the recorded reply (``replay.session.reader``).
    reader: Reader | None = None
    received: list[Received] = field(default_factory=list)
    # What the answering model consumed (forwarded requests): calls and tokens.
    model_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model_seconds: float = 0.0
    # The step's simulated time (``replay.session.clock``): when its requests reach the cache.
    at: float = 0.0


class RecordedUpstream:
    def __init__(self) -> None:
        self.tickets: dict[str, Ticket] = {}
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._http: httpx.AsyncClient | None = None
        self.port = 0
        self.unexpected = 0
        self.counter = TokenCounter()
        self.sessions: OrderedDict[str, SessionLog] = OrderedDict()

    @property
    def root_url(self) -> str:
        """The API root, as Google's base URLs are given (``gemini.base_url``)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """OpenAI's and Anthropic's base URL (``upstream.base_url``, ``anthropic.base_url``)."""
        return self.root_url + "/v1"

    def issue(self, ticket: Ticket) -> str:
        name = f"t{next(self._ids)}"
        self.tickets[name] = ticket
        return name

    def close_ticket(self, name: str) -> Ticket:
        return self.tickets.pop(name)

    def take_session(self, session: str) -> list[dict[str, Any]]:
        """The shapes of every request of ``session`` so far, as JSON (``replay.session.cost``), and
        the log forgotten."""
        log = self.sessions.pop(session, None)
        return log.to_json() if log is not None else []

    def _log(self, session: str) -> SessionLog:
        log = self.sessions.get(session)
        if log is None:
            log = self.sessions[session] = SessionLog()
            while len(self.sessions) > MAX_SESSIONS:
                self.sessions.popitem(last=False)
        self.sessions.move_to_end(session)
        return log

    def _blocks(
        self, parsed: Parsed, digests: Sequence[bytes], tokens: Sequence[int]
    ) -> list[tuple[bytes, int]]:
        """The tool schemas (with the model: a cache is per model) and each message, as blocks."""
        raw = parsed.body.get("tools")
        tools: list[Any] = raw if isinstance(raw, list) else []
        neutral = parsed.neutral.get("tools") or []
        model = parsed.neutral.get("model")
        encoding = self.counter.encoding_for(model)
        head = (message_digest([model, tools]), self.counter.count_tools(neutral, encoding))
        return [head, *zip(digests, tokens, strict=True)]

    async def start(self, port: int = 0) -> None:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._route)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1]
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0), trust_env=False)

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.aclose()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _route(self, request: web.Request) -> web.StreamResponse:
        """A request of a replayed door (found as the proxy finds it, a Gemini door's model from
        its path), answered; anything else is unexpected."""
        found = _DOOR_TABLE.find(
            request.method.encode(), request.rel_url.raw_path.encode(), request.query_string.encode()
        )
        if found is None:
            self.unexpected += 1
            return web.json_response(
                {"error": {"message": "not recorded", "type": "invalid_request_error"}}, status=404
            )
        door, target = found
        return await self._answer(request, door.dialect, target)

    async def _answer(self, request: web.Request, dialect: str, target: Target) -> web.StreamResponse:
        name = request.headers.get(TICKET_HEADER, "")
        ticket = self.tickets.get(name)
        raw = await request.read()
        if ticket is None:
            self.unexpected += 1
            return web.json_response(
                {"error": {"message": f"unknown replay ticket {name!r}", "type": "invalid_request_error"}},
                status=400,
            )
        body = orjson.loads(raw)
        parsed = read(dialect, body, target)
        messages = parsed.neutral["messages"]
        model = parsed.neutral.get("model")
        breakpoints = adapter(dialect).cache_marks(parsed)
        names = tool_names(parsed)
        kind = request_kind(ticket)
        digests = tuple(message_digest(m) for m in messages)
        conversation = parse(messages)
        tokens = self.counter.count_messages(messages, self.counter.encoding_for(model))
        ticket.received.append(
            Received(
                messages=messages if ticket.keep_messages else None,
                message_count=len(messages),
                digests=digests,
                problems=conversation.problems,
                tool_names=names,
                tokens=tokens,
                tail_start=conversation.tail_start,
            )
        )
        session = request.headers.get(SESSION_HEADER)
        blocks = self._blocks(parsed, digests, tokens)
        if ticket.reply is None and ticket.forward is not None:
            output = ticket.completion_tokens
            if dialect != "chat":
                response = await self._forward_converted(dialect, parsed, ticket, ticket.forward)
            else:
                response = await self._forward(body, ticket, ticket.forward)
            if session:
                output = ticket.completion_tokens - output
                self._log(session).add(kind, blocks, breakpoints, REPLY_PRIMING, output, ticket.at)
            return response
        if session:
            self._log(session).add(kind, blocks, breakpoints, REPLY_PRIMING, at=ticket.at)
        reads = None
        if ticket.reader is not None:
            reads = ticket.reader.answer(messages, names, view_text(messages))
        reply = dict(reads or ticket.reply or {"role": "assistant", "content": ""})
        reply["role"] = "assistant"
        reply.setdefault("content", None)
        answer_id = f"replay-{name}-{len(ticket.received)}"
        written = answer(dialect, reply, model, answer_id)
        return web.Response(body=orjson.dumps(written), content_type="application/json")

    async def _forward_converted(
        self, dialect: str, parsed: Parsed, ticket: Ticket, endpoint: ModelEndpoint
    ) -> web.Response:
        """A question through another door than chat's, answered by a model that speaks chat."""
        response = await self._forward(chat_request(parsed), ticket, endpoint)
        if response.status != 200 or response.body is None:
            return response
        try:
            data = orjson.loads(response.body)  # type: ignore[arg-type]
            message = data["choices"][0]["message"]
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            return response
        written = answer(dialect, message, parsed.neutral.get("model"), "forwarded", data.get("usage"))
        return web.Response(body=orjson.dumps(written), content_type="application/json")

    async def _forward(self, body: dict[str, Any], ticket: Ticket, endpoint: ModelEndpoint) -> web.Response:
        assert self._http is not None
        payload = {
            **body,
            "model": endpoint.model,
            "temperature": endpoint.temperature,
            "max_tokens": endpoint.max_tokens,
            "stream": False,
        }
        payload.pop("stream_options", None)
        started = time.perf_counter()
        try:
            response = await self._http.post(
                endpoint.base_url.rstrip("/") + "/chat/completions",
                content=orjson.dumps(payload),
                headers={
                    "content-type": "application/json",
                    "authorization": f"Bearer {endpoint.api_key()}",
                },
                timeout=endpoint.timeout,
            )
        except httpx.HTTPError as error:
            return web.json_response(
                {"error": {"message": f"answering model unreachable: {error}", "type": "upstream_error"}},
                status=502,
            )
        ticket.model_calls += 1
        ticket.model_seconds += time.perf_counter() - started
        try:
            usage = response.json().get("usage") or {}
            ticket.prompt_tokens += int(usage.get("prompt_tokens") or 0)
            ticket.completion_tokens += int(usage.get("completion_tokens") or 0)
        except (ValueError, AttributeError, TypeError):
            pass
        return web.Response(
            body=response.content,
            status=response.status_code,
            content_type="application/json",
        )
