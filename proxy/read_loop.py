"""The ``read_tool_output`` loop: answer the model's reads inside the proxy, then ask again.

When the upstream's answer calls ``read_tool_output``, the proxy runs the reads against the
store, appends the call and its results to the messages and asks the upstream again, up to
``max_rounds`` rounds; the last round is sent without the read tool, so it ends in an answer
or in a call of the agent's own tools (the agent's loop goes on as it would without the
proxy). The client receives only the final answer, with usage summed over all rounds.

**Every round fits the window.** A read result gets at most the tokens left under the window
after the round's messages, the tool schemas and the answer's reserve (the request's
``max_tokens`` or ``max_completion_tokens``, at least the policy's reserve), split between the
reads of one answer and capped per result; it says what it left out. Reads per answer and
bytes read per request are limited too; past a limit the model is told so and goes on without.

If one answer mixes ``read_tool_output`` with the agent's own tool calls, the proxy resolves
its reads and asks again, and the agent's calls of that answer are never run: the model
re-issues them with the evidence in hand, and the agent never receives a call planned before
the model read what it asked for. (Chat drops those calls from the round it sends back; the
Responses and Messages doors send the answer back whole, each of those calls answered with
``NOT_RUN``, since their reasoning and thinking must return with the items that followed them.)

``ReadLoop`` is the sans-I/O core (next request, feed an answer, get reads or the end), the
same for every wire format: its ``Dialect`` counts, appends rounds and withdraws the tool. The
driver below moves bytes, and every response goes through a ``ResponseWriter``: a round that
fails before anything reached the client answers with the upstream's status and body, one that
fails after ends the stream with the dialect's error event and no end-of-stream marker.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import orjson

from policies.tokens import TokenCounter
from proxy.dialects.base import Answer, Dialect
from proxy.errors import ProxyError
from proxy.forwarding import client_response_headers
from proxy.read_tool import BadArguments, ReadLimits, ReadResult, parse_arguments, render
from proxy.response_writer import ResponseWriter
from proxy.store import Store
from proxy.upstream import Upstream, failure_kind, upstream_failure

# Tokens a tool message costs beyond its content (framing, role, the call id).
_RESULT_OVERHEAD = 16
# Below this many tokens of room, a read returns nothing but the advice to go on without it.
_MIN_READ_TOKENS = 48
# The room a read's "no room" answer needs; with less, the calls are dropped unanswered.
_SHORT_RESULT_TOKENS = 32
_NO_ROOM = "Error: no room is left in the context window for saved output; go on without it."


@dataclass(frozen=True, slots=True)
class LoopLimits:
    max_rounds: int = 4
    max_calls_per_answer: int = 8
    max_total_bytes: int = 262_144
    read: ReadLimits = field(default_factory=ReadLimits)
    timeout_seconds: float = 5.0


@dataclass
class LoopResult:
    rounds: int = 0
    reads: list[str] = field(default_factory=list)  # outcome of each read: ok, truncated, not_found...
    usage_per_round: list[dict[str, Any]] = field(default_factory=list)
    # Prompt tokens of each request sent upstream, in the proxy's count.
    round_tokens: list[int] = field(default_factory=list)
    bytes_read: int = 0
    status: int = 0
    upstream_seconds: float = 0.0
    error: str | None = None

    @property
    def largest_request(self) -> int:
        return max(self.round_tokens, default=0)


class ReadLoop:
    """The loop's decisions, without I/O: what to send next, and what an answer asks for."""

    def __init__(
        self,
        body: dict[str, Any],
        *,
        dialect: Dialect,
        counter: TokenCounter,
        window: int,
        reserve: int,
        limits: LoopLimits,
        requested: int = 0,
    ) -> None:
        """``body``: the first round's wire body, read tool included. ``reserve``: tokens kept
        for the answer (at least the request's own ``max_tokens``); ``requested``: the answer
        length the request asks for (0: none)."""
        self.body = body
        self.dialect = dialect
        self.requested = requested
        self.counter = counter
        self.encoding = counter.encoding_for(body.get("model"))
        self.window = window
        self.reserve = reserve
        self.limits = limits
        self.result = LoopResult()
        self.exhausted = False  # a limit was reached: the next round goes without the read tool
        self._previous: dict[str, Any] | None = None  # the body before the last reads

    @property
    def budget(self) -> int:
        """The largest request a round may be: the window less the answer's reserve."""
        return self.window - self.reserve

    @property
    def hard_budget(self) -> int:
        """What a round may never exceed: the window less the answer the client asked for (and
        half the policy's reserve for counting differences). Only the short answers that tell
        the model a read did not fit may use the room between the two budgets."""
        return self.window - max(self.reserve // 2, self.requested)

    def next_request(self) -> dict[str, Any]:
        """The body of the next round. The last allowed one goes without the read tool: the
        model then answers, or calls the agent's own tools (``tool_choice: none`` would forbid
        those, and an agent takes a text answer for the end of its task). A round whose reads
        came out larger than the room they were given (counting is done per piece) is sent
        without them: the model goes on from what it had."""
        if self.dialect.count(self.body, self.counter) > self.hard_budget and self._previous is not None:
            self.body, self._previous = self._previous, None
            self.exhausted = True
        body = self.body
        if self.result.rounds >= self.limits.max_rounds or self.exhausted:
            body = self.dialect.without_read_tool(body)
        self.result.round_tokens.append(self.dialect.count(body, self.counter))
        return body

    def wants_reads(self, calls: list[Any]) -> list[Any]:
        """The internal calls of an answer the loop will resolve (none once rounds run out)."""
        internal = [c for c in calls if self.dialect.is_read_call(c)]
        if not internal or self.result.rounds >= self.limits.max_rounds:
            return []
        return internal

    def room_per_read(self, answer: Answer, calls: list[Any], *, hard: bool = False) -> int:
        """Tokens one read result may hold so the next round stays within the window."""
        base = self.dialect.count(
            self.dialect.add_round(self.body, answer, [(c, "") for c in calls]), self.counter
        )
        room = (self.hard_budget if hard else self.budget) - base - len(calls) * _RESULT_OVERHEAD
        return max(0, min(self.limits.read.max_result_tokens, room // max(1, len(calls))))

    def add_round(self, answer: Answer, results: list[tuple[Any, str]]) -> None:
        self.result.rounds += 1
        self._previous = self.body
        self.body = self.dialect.add_round(self.body, answer, results)

    def skip_round(self) -> None:
        """The answer's reads do not fit at all: ask again without them and without the tool."""
        self.result.rounds += 1
        self.exhausted = True


async def resolve_reads(loop: ReadLoop, store: Store, tenant: str, calls: list[Any], answer: Answer) -> None:
    """Run one answer's reads against the store and append them (with the calls) to the loop."""
    limits = loop.limits
    allowed = calls[: limits.max_calls_per_answer]
    room = loop.room_per_read(answer, calls)
    if room < _MIN_READ_TOKENS:
        # No room for content: every call still gets a short answer when that fits the window,
        # and the next round goes without the read tool.
        if loop.room_per_read(answer, calls, hard=True) < _SHORT_RESULT_TOKENS:
            # Not even that: asked again without the calls (there is no room to say why).
            loop.result.reads.extend("no_room" for _ in calls)
            loop.skip_round()
            return
        loop.result.reads.extend("no_room" for _ in calls)
        loop.exhausted = True
        loop.add_round(answer, [(call, _NO_ROOM) for call in calls])
        return
    results: list[tuple[Any, str]] = []
    for position, call in enumerate(calls):
        if position >= len(allowed):
            outcome = ReadResult(
                f"Error: at most {limits.max_calls_per_answer} reads per answer; ask for the rest in your "
                "next answer.",
                "limited",
            )
        else:
            outcome = await _read_one(loop, store, tenant, call, room)
        loop.result.reads.append(outcome.outcome)
        loop.result.bytes_read += len(outcome.text.encode("utf-8", "replace"))
        results.append((call, outcome.text))
    if loop.result.bytes_read >= limits.max_total_bytes or room < _MIN_READ_TOKENS:
        loop.exhausted = True
    loop.add_round(answer, results)


async def _read_one(loop: ReadLoop, store: Store, tenant: str, call: Any, room: int) -> ReadResult:
    return await read_saved_output(
        store,
        tenant,
        loop.dialect.call_arguments(call),
        limits=loop.limits,
        room=room,
        counter=loop.counter,
        encoding=loop.encoding,
        bytes_read=loop.result.bytes_read,
    )


async def read_saved_output(
    store: Store,
    tenant: str,
    arguments: Any,
    *,
    limits: LoopLimits,
    room: int,
    counter: TokenCounter,
    encoding: str,
    bytes_read: int = 0,
) -> ReadResult:
    """One ``read_tool_output`` call: the result text and its outcome (``ok``, ``truncated``,
    ``not_found``, ``expired``, ``bad_arguments``, ``limited``, ``store_error``, ``timeout``)."""
    try:
        args = parse_arguments(arguments, limits.read.max_lines)
    except BadArguments as exc:
        return ReadResult(str(exc), "bad_arguments")
    if bytes_read >= limits.max_total_bytes:
        return ReadResult(
            f"Error: this answer has read {bytes_read} bytes of saved outputs, the limit per request; "
            "go on with what you have.",
            "limited",
        )
    if room < _MIN_READ_TOKENS:
        return ReadResult(_NO_ROOM, "no_room")
    try:
        stored = await store.get_output(tenant, args.handle)
    except Exception:  # the store is down: the model is told, the request goes on
        return ReadResult(f"Error: the saved output {args.handle!r} cannot be read right now.", "store_error")
    if stored is None:
        return ReadResult(f"Error: no saved output with handle {args.handle!r} was found.", "not_found")
    if stored.content is None:
        return ReadResult(
            f"Error: the saved output {args.handle!r} has expired and can no longer be read.", "expired"
        )
    read_limits = replace(
        limits.read,
        max_result_bytes=max(256, min(limits.read.max_result_bytes, limits.max_total_bytes - bytes_read)),
    )
    try:
        return await asyncio.wait_for(
            asyncio.to_thread(
                render,
                args.handle,
                stored.content,
                args,
                limits=read_limits,
                budget_tokens=room,
                counter=counter,
                encoding=encoding,
            ),
            timeout=limits.timeout_seconds,
        )
    except BadArguments as exc:
        return ReadResult(str(exc), "bad_arguments")
    except TimeoutError:
        return ReadResult(
            "Error: the read took too long; ask for fewer lines or a simpler pattern.", "timeout"
        )


def _response_headers(response: httpx.Response) -> list[tuple[bytes, bytes]]:
    return [
        (k, v)
        for k, v in client_response_headers(response.headers.raw)
        if k not in (b"content-length", b"content-encoding")
    ]


def _round_headers(response: httpx.Response, request_id: bytes) -> list[tuple[bytes, bytes]]:
    headers = _response_headers(response)
    if not any(k == b"x-request-id" for k, _ in headers):
        headers.append((b"x-request-id", request_id))
    return headers


def _upstream_error(status: int, raw: bytes) -> ProxyError:
    """A read round the upstream refused, for a client whose response has already started."""
    message = f"The upstream answered HTTP {status} to a read_tool_output round."
    code: str | None = None
    try:
        error = orjson.loads(raw).get("error")
        if isinstance(error, dict):
            message += f" {error.get('message') or ''}".rstrip()
            code = error.get("code") if isinstance(error.get("code"), str) else None
    except (orjson.JSONDecodeError, AttributeError):
        pass
    return ProxyError(
        status if status >= 400 else 502, message, type="upstream_error", code=code or "upstream_error"
    )


class LoopDriver:
    """Runs a ``ReadLoop`` against the upstream for one client request (JSON or a stream), in
    the loop's dialect."""

    def __init__(
        self,
        loop: ReadLoop,
        *,
        upstream: Upstream,
        store: Store,
        url: str,
        headers: list[tuple[bytes, bytes]],
        tenant: str,
        writer: ResponseWriter,
        request_id: str,
    ) -> None:
        self.loop = loop
        self.dialect = loop.dialect
        self.upstream = upstream
        self.store = store
        self.url = url
        # The proxy must read these answers, so it asks for them uncompressed.
        self.headers = [(k, v) for k, v in headers if k != b"accept-encoding"] + [
            (b"accept-encoding", b"identity")
        ]
        self.tenant = tenant
        self.writer = writer
        self.request_id = request_id.encode()

    @property
    def result(self) -> LoopResult:
        return self.loop.result

    async def run(self) -> LoopResult:
        try:
            if self.loop.body.get("stream") is True:
                await self._run_stream()
            else:
                await self._run_json()
        except httpx.HTTPError as exc:
            self.result.error = failure_kind(exc) if not self.writer.started else _stream_failure(exc)
            await self.writer.fail(upstream_failure(exc))
        return self.result

    async def _open(self) -> httpx.Response:
        body = self.loop.next_request()
        self.writer.set_header(b"x-compaction-tokens-after", str(self.result.largest_request).encode())
        self.writer.set_header(b"x-compaction-read-rounds", str(self.result.rounds).encode())
        started = time.perf_counter()
        try:
            return await self.upstream.open("POST", self.url, self.headers, orjson.dumps(body))
        finally:
            self.result.upstream_seconds += time.perf_counter() - started

    async def _refused(self, response: httpx.Response) -> None:
        """A round answered with an error status: relayed if nothing was sent yet."""
        raw = await response.aread()
        self.result.status = response.status_code
        if not self.writer.started:
            await self.writer.respond(response.status_code, _round_headers(response, self.request_id), raw)
            return
        self.result.error = "upstream_error"
        await self.writer.fail(_upstream_error(response.status_code, raw))

    async def _run_json(self) -> None:
        total: dict[str, int] = {}
        while True:
            response = await self._open()
            started = time.perf_counter()
            try:
                if response.status_code != 200:
                    await self._refused(response)
                    return
                raw = await response.aread()
            finally:
                await response.aclose()
                self.result.upstream_seconds += time.perf_counter() - started
            self.result.status = 200
            try:
                data: Any = orjson.loads(raw)
            except orjson.JSONDecodeError:
                data = None
            answer = self.dialect.json_answer(data)
            if answer is None:
                await self.writer.respond(200, _round_headers(response, self.request_id), raw)
                return
            self.dialect.add_usage(total, answer.usage)
            self.result.usage_per_round.append(answer.usage or {})
            reads = self.loop.wants_reads(answer.calls)
            if reads:
                await resolve_reads(self.loop, self.store, self.tenant, reads, answer)
                continue
            await self.writer.respond(
                200, _round_headers(response, self.request_id), self.dialect.final_json(data, total)
            )
            return

    async def _run_stream(self) -> None:
        total: dict[str, int] = {}
        while True:
            response = await self._open()
            started = time.perf_counter()
            try:
                if response.status_code != 200:
                    await self._refused(response)
                    return
                self.result.status = 200
                if not self.writer.started:
                    self.writer.start(200, _round_headers(response, self.request_id), streaming=True)
                stream = self.dialect.codec(self.writer)
                buffer = b""
                async for chunk in response.stream:  # type: ignore[union-attr]
                    buffer += chunk
                    *events, buffer = buffer.replace(b"\r\n", b"\n").split(b"\n\n")
                    for event in events:
                        await stream.take(event)
                if buffer.strip():
                    await stream.take(buffer)
            finally:
                await response.aclose()
                self.result.upstream_seconds += time.perf_counter() - started
            if stream.error is not None:
                # The upstream itself ended its stream with an error event: relayed as such.
                self.result.error = "upstream_error"
                await self.writer.finish()
                return
            self.dialect.add_usage(total, stream.usage)
            self.result.usage_per_round.append(stream.usage or {})
            reads = self.loop.wants_reads(stream.calls())
            if reads:
                answer = Answer(
                    calls=stream.calls(), text=stream.text or None, usage=stream.usage, items=stream.items()
                )
                await resolve_reads(self.loop, self.store, self.tenant, reads, answer)
                continue
            if not stream.complete:
                # The upstream closed its stream without finishing the answer.
                self.result.error = "upstream_reset"
                await self.writer.fail(
                    ProxyError(
                        502,
                        "The upstream stream ended before the answer was complete.",
                        type="upstream_error",
                        code="upstream_reset",
                    )
                )
                return
            await stream.finish(total)
            return


def _stream_failure(exc: httpx.HTTPError) -> str:
    return "upstream_timeout" if isinstance(exc, httpx.TimeoutException) else "upstream_reset"
