"""Summarizers that call a model: any OpenAI-compatible chat endpoint.

The summarizer has its own base URL, key and model (a cheaper model than the agent's is
the common choice), a timeout and bounded retries. An answer that is empty or cut off is
garbage and counts as a failure. After ``breaker_failures`` consecutive failures in a
session the breaker opens and the session uses the ledger alone for ``breaker_cooldown``
seconds; every fallback is recorded with its reason by the compaction stage.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from policies.prompts import summary_messages
from policies.summarizer import SummaryRequest, SummaryResult
from proxy.config.sections import SummarizerSettings
from proxy.summaries.credentials import Origin, Pair, SummaryCredential, summary_credential

_RETRYABLE = {408, 409, 429, 500, 502, 503, 504}


class SummarizerError(RuntimeError):
    """The model gave no usable summary; the message says why (never any content)."""

    # The message is safe to record in events and logs.
    public = True


class BreakerOpen(SummarizerError):
    pass


def _origin(url: str) -> tuple[str, str, int]:
    parsed = httpx.URL(url)
    return parsed.scheme, parsed.host, parsed.port or (443 if parsed.scheme == "https" else 80)


class OpenAISummarizer:
    """One per app; ``for_session`` gives the per-session view with its circuit breaker."""

    def __init__(
        self,
        settings: SummarizerSettings,
        *,
        base_url: str,
        api_key: str | None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self.client = httpx.AsyncClient(
            base_url=(settings.base_url or base_url).rstrip("/"),
            transport=transport,
            timeout=httpx.Timeout(settings.timeout, connect=min(10.0, settings.timeout)),
            trust_env=False,
        )
        # The upstream's key and the clients' keys are for the upstream's host: they go to a
        # summarizer on another host only if configured there explicitly (summarizer.api_key).
        # Which one pays for a given client's summary: ``credential_for`` (credentials.py).
        self.same_host = settings.base_url is None or _origin(settings.base_url) == _origin(base_url)
        self.operator_key = settings.api_key or (api_key if self.same_host else None)
        self.origin = _origin(settings.base_url or base_url)
        self.calls = 0
        self._breakers: OrderedDict[str, _Breaker] = OrderedDict()

    def takes_key_for(self, client_origin: Origin | None) -> bool:
        """Whether a client's credential, presented for the upstream at ``client_origin`` (the
        provider its request addressed), may go to this summarizer: only to that same scheme,
        host and port. An Anthropic token never goes to an OpenAI host, whatever the config."""
        return client_origin is not None and client_origin == self.origin

    def credential_for(
        self, client_headers: list[Pair], client_origin: Origin | None, fallback: Pair | None
    ) -> SummaryCredential:
        """The credential that pays for this client's summary: the one its own request uses
        upstream (``fallback``: the operator's key, which the addressed provider gets for a
        client that sends none; credentials.py has the whole rule)."""
        return summary_credential(
            client_headers,
            client_origin=client_origin,
            fallback=fallback,
            summarizer_origin=self.origin,
            summarizer_key=self.settings.api_key,
            operator_key=self.operator_key,
            every_client=self.settings.api_key_pays_for == "every_client",
        )

    def for_session(self, session: str, credential: SummaryCredential) -> SessionSummarizer:
        """The summarizer for one session, paying with ``credential`` (``credential_for`` the
        client whose request is being compacted)."""
        breaker = self._breakers.pop(session, None) or _Breaker()
        self._breakers[session] = breaker
        while len(self._breakers) > 10_000:
            self._breakers.popitem(last=False)
        return SessionSummarizer(self, breaker, credential)

    async def _call(self, request: SummaryRequest, credential: tuple[Pair, ...]) -> SummaryResult:
        limit = self.settings.max_input_tokens
        # Input and output share the model's window; ~3 characters per token is conservative
        # for code and logs.
        max_chars = (limit - self.settings.max_output_tokens) * 3 if limit else None
        prompt, messages = summary_messages(request, max_chars=max_chars)
        body: dict[str, Any] = {
            "model": self.settings.model,
            "messages": messages,
            "max_tokens": self.settings.max_output_tokens,
            "temperature": 0,
        }
        # The credential's headers exactly as the upstream gets them for this client.
        headers = [(b"content-type", b"application/json"), *credential]
        started = time.perf_counter()
        attempt = 0
        while True:
            attempt += 1
            self.calls += 1
            try:
                status, content = await self._post(orjson.dumps(body), headers)
            except (httpx.HTTPError, TimeoutError) as exc:
                if attempt <= self.settings.max_retries:
                    await asyncio.sleep(min(2.0, 0.25 * 2**attempt))
                    continue
                raise SummarizerError(f"summarizer unreachable or timed out ({type(exc).__name__})") from exc
            if status in _RETRYABLE and attempt <= self.settings.max_retries:
                await asyncio.sleep(min(2.0, 0.25 * 2**attempt))
                continue
            if status != 200:
                raise SummarizerError(f"summarizer answered HTTP {status}")
            return _parse(content, prompt.family, prompt.version, time.perf_counter() - started)

    async def _post(self, body: bytes, headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes]:
        """One call: its status and its answer's bytes. The whole call (connecting, sending,
        every byte of the answer) holds to ``timeout``: a server that trickles its answer a
        byte at a time, or stops mid-body, never holds a preparation or a compaction point
        longer. The answer is read up to ``max_answer_bytes`` (decoded): a 20 MB or endless
        answer fails at once instead of filling the memory."""
        limit = max_answer_bytes(self.settings.max_output_tokens)
        request = self.client.build_request("POST", "/chat/completions", content=body, headers=headers)
        async with asyncio.timeout(self.settings.timeout):
            answer = await self.client.send(request, stream=True)
            try:
                chunks: list[bytes] = []
                size = 0
                async for chunk in answer.aiter_bytes():
                    size += len(chunk)
                    if size > limit:
                        raise SummarizerError(f"summarizer answer over {limit} bytes")
                    chunks.append(chunk)
                return answer.status_code, b"".join(chunks)
            finally:
                await answer.aclose()

    async def aclose(self) -> None:
        await self.client.aclose()


def max_answer_bytes(max_output_tokens: int) -> int:
    """The largest summarizer answer read: a chat completion of ``max_output_tokens`` tokens is
    a few kilobytes of JSON (at most ~4 bytes a token, escaped), so 64 bytes a token, and at
    least 1 MiB, leave room for any honest answer."""
    return max(1 << 20, 64 * max_output_tokens)


def _parse(raw: bytes, family: str, version: str, seconds: float) -> SummaryResult:
    try:
        data = orjson.loads(raw)
        choice = data["choices"][0]
        text = choice["message"]["content"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
        raise SummarizerError("summarizer answer is not a chat completion") from exc
    if not isinstance(text, str) or len(text.strip()) < 20:
        raise SummarizerError("summarizer answer is empty or too short")
    if choice.get("finish_reason") == "length":
        raise SummarizerError("summarizer answer was cut off at max_output_tokens")
    usage = data.get("usage") or {}
    return SummaryResult(
        text=text.strip(),
        model=str(data.get("model") or ""),
        prompt_family=family,
        prompt_version=version,
        input_tokens=int(usage.get("prompt_tokens") or 0),
        output_tokens=int(usage.get("completion_tokens") or 0),
        seconds=seconds,
    )


@dataclass
class _Breaker:
    failures: int = 0
    open_until: float = 0.0


class SessionSummarizer:
    def __init__(self, parent: OpenAISummarizer, breaker: _Breaker, credential: SummaryCredential) -> None:
        self.parent = parent
        self.breaker = breaker
        self.credential = credential

    @property
    def payer(self) -> str:
        """Which credential pays (a digest): prepared summaries are served under it only."""
        return self.credential.payer

    @property
    def payable(self) -> bool:
        return self.credential.refused is None

    @property
    def keyless(self) -> bool:
        """Asked with no credential at all: the operator's own capacity (a local model)."""
        return self.credential.refused is None and not self.credential.headers

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        settings = self.parent.settings
        if self.credential.refused is not None:
            # No credential of this client's may pay: the ledger, not a failure of the model.
            raise SummarizerError(self.credential.refused)
        now = time.monotonic()
        if self.breaker.open_until > now:
            raise BreakerOpen(f"circuit open after {settings.breaker_failures} consecutive failures")
        try:
            result = await self.parent._call(request, self.credential.headers)
        except SummarizerError:
            self.breaker.failures += 1
            if self.breaker.failures >= settings.breaker_failures:
                self.breaker.open_until = now + settings.breaker_cooldown
                self.breaker.failures = 0
            raise
        self.breaker.failures = 0
        return result
