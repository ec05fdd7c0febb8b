"""The fake Chat Completions model on loopback: an aiohttp server in its own thread and event
loop (like ``FakeUpstream``) that answers ``/v1/chat/completions`` as the scripted model
decides, ``/v1/models`` and the metadata routes of the kind of server it plays."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from typing import Any

import orjson
from aiohttp import web

from tests.agent_upstream import wire
from tests.agent_upstream.protocol import Failure, refusal_body
from tests.agent_upstream.records import Conversation
from tests.agent_upstream.script import ScriptedModel
from tests.fake_upstream import LoopbackServer


class AgentUpstream(ScriptedModel):
    """The scripted model served over HTTP; takes ``ScriptedModel``'s options."""

    def __init__(self, *, flavor: str = "openai", metadata: str = "none", **options: Any) -> None:
        super().__init__(**options)
        self.flavor = flavor
        self.metadata = metadata
        self.metadata_asked: list[str] = []
        self.port = 0
        self._lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _metadata(self, path: str) -> web.Response | None:
        """What a server of ``metadata``'s kind answers on its metadata routes."""
        entry: dict[str, Any] = {"id": self.model, "object": "model", "owned_by": self.metadata}
        if path == "/v1/models":
            self.metadata_asked.append(path)
            if self.metadata == "vllm":
                entry["max_model_len"] = self.window
            return web.json_response({"object": "list", "data": [entry]})
        if path == "/props" and self.metadata == "llamacpp":
            self.metadata_asked.append(path)
            return web.json_response(
                {"default_generation_settings": {"n_ctx": self.window}, "total_slots": 1}
            )
        if path == "/api/show" and self.metadata == "ollama":
            self.metadata_asked.append(path)
            return web.json_response(
                {
                    "parameters": f"num_ctx {self.window}",
                    "details": {"family": "llama"},
                    "model_info": {"llama.context_length": 131072},
                }
            )
        if path == f"/api/v0/models/{self.model}" and self.metadata == "lmstudio":
            self.metadata_asked.append(path)
            return web.json_response(
                {**entry, "max_context_length": 131072, "loaded_context_length": self.window}
            )
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        told = self._metadata(request.path.rstrip("/"))
        if told is not None:
            return told
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
                refusal_body(self.flavor, self.window, seen.tokens), status=400, headers=base_headers
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
            usage = wire.usage(self.counter, seen.tokens, answer, seen.cached)
            return web.json_response(
                wire.completion(self.model, completion_id, answer, usage), headers=base_headers
            )
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        stream_usage = wire.usage(self.counter, seen.tokens, answer, seen.cached) if include_usage else None
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
