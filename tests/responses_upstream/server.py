"""The fake Responses model on loopback: an aiohttp server in its own thread and event loop
that answers ``POST /v1/responses`` as the scripted model decides, and ``GET /v1/models``;
other routes get a 404 and are recorded in ``others``."""

from __future__ import annotations

import asyncio
import itertools
import threading
from typing import Any

import orjson
from aiohttp import web

from tests.fake_upstream import LoopbackServer
from tests.responses_upstream import wire
from tests.responses_upstream.protocol import Failure, invalid_request
from tests.responses_upstream.records import Conversation
from tests.responses_upstream.script import ScriptedReasoningModel, stable_hex


class ResponsesUpstream(ScriptedReasoningModel):
    """The scripted reasoning model served over HTTP; takes ``ScriptedReasoningModel``'s
    options."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.others: list[tuple[str, str, dict[str, str]]] = []  # (method, path, headers) of other routes
        self.port = 0
        self._lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

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
        request_id = "req_" + stable_hex(seen.index, seen.conversation, size=32)
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
            planned_usage = wire.usage(self.counter, seen.tokens, planned)
            stream = wire.events(self.model, response_id, body, planned, planned_usage)
            for data in stream[: answer.after_events]:
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
            usage = wire.usage(self.counter, seen.tokens, answer)
            return web.json_response(
                wire.response(self.model, response_id, body, answer, usage, "completed"), headers=base_headers
            )
        response = web.StreamResponse(status=200, headers=sse_headers)
        await response.prepare(request)
        usage = wire.usage(self.counter, seen.tokens, answer)
        for data in wire.events(self.model, response_id, body, answer, usage):
            await response.write(data)
        await response.write_eof()
        return response

    def start(self) -> ResponsesUpstream:
        self.counter.warm_up()

        self._server = LoopbackServer(self._handle, "responses-upstream")
        self.port = self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()
