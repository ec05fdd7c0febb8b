"""The fake Chat Completions model on loopback: an aiohttp server in its own thread and event
loop (like ``FakeUpstream``) that answers ``/v1/chat/completions`` as the scripted model
decides, and ``/v1/models``."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from typing import Any

import orjson
from aiohttp import web

from tests.agent_upstream import wire
from tests.agent_upstream.protocol import Failure, context_length_error
from tests.agent_upstream.records import Conversation
from tests.agent_upstream.script import ScriptedModel
from tests.fake_upstream import LoopbackServer


class AgentUpstream(ScriptedModel):
    """The scripted model served over HTTP; takes ``ScriptedModel``'s options."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.port = 0
        self._lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

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
            chunks = wire.chunks(self.model, completion_id, planned, None)
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
            usage = wire.usage(self.counter, seen.tokens, answer)
            return web.json_response(
                wire.completion(self.model, completion_id, answer, usage), headers=base_headers
            )
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        stream_usage = wire.usage(self.counter, seen.tokens, answer) if include_usage else None
        response = web.StreamResponse(
            status=200,
            headers={**base_headers, "content-type": "text/event-stream", "cache-control": "no-cache"},
        )
        await response.prepare(request)
        for data in wire.chunks(self.model, completion_id, answer, stream_usage):
            await response.write(data)
        await response.write_eof()
        return response

    def start(self) -> AgentUpstream:
        self.counter.warm_up()

        self._server = LoopbackServer(self._handle, "agent-upstream")
        self.port = self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()
