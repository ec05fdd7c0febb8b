"""A summarizer that answers 20 MB, garbage, or hangs mid-body: the call fails fast and
bounded (the answer read up to ``max_answer_bytes``, the whole call within ``timeout``), and
the compaction point falls back to the ledger."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from policies.ledger_extraction import build_ledger
from policies.summarizer import SummaryRequest
from proxy.config.settings import SummarizerSettings
from proxy.summaries.credentials import bearer
from proxy.summaries.summarizer import OpenAISummarizer, SummarizerError, max_answer_bytes

HISTORY: list[Any] = [
    {"role": "system", "content": "You fix bugs."},
    {"role": "user", "content": "Fix the parser in src/parse.py"},
]


PAID = bearer("sk-x")


def request() -> SummaryRequest:
    return SummaryRequest(
        previous_summary=None, messages=HISTORY[1:], ledger=build_ledger(HISTORY), prompt_family="hybrid_v2"
    )


class Streamed:
    """An answer whose body is ``chunks`` (an async generator), counting what was pulled."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self.chunks = chunks
        self.pulled = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.chunks:
            self.pulled += len(chunk)
            yield chunk


def summarizer(body: Streamed, timeout: float = 2.0) -> OpenAISummarizer:
    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "application/json"}, content=body)

    settings = SummarizerSettings(kind="openai", model="small-model", timeout=timeout, max_retries=0)
    return OpenAISummarizer(
        settings, base_url="http://127.0.0.1:9/v1", api_key="sk-x", transport=httpx.MockTransport(handler)
    )


async def test_a_20_mb_answer_is_refused_after_reading_at_most_the_limit() -> None:
    async def huge() -> AsyncIterator[bytes]:
        yield b'{"choices":[{"message":{"content":"'
        for _ in range(20 * 16):  # 20 MB in 64 KB pieces
            yield b"x" * 65_536
        yield b'"}}]}'

    body = Streamed(huge())
    with pytest.raises(SummarizerError, match=r"over \d+ bytes"):
        await summarizer(body).for_session("s", PAID).summarize(request())
    limit = max_answer_bytes(SummarizerSettings().max_output_tokens)
    assert body.pulled <= limit + 65_536 < 20 * 1024 * 1024


async def test_garbage_is_a_failed_call() -> None:
    async def garbage() -> AsyncIterator[bytes]:
        yield bytes(range(256)) * 64

    with pytest.raises(SummarizerError, match="not a chat completion"):
        await summarizer(Streamed(garbage())).for_session("s", PAID).summarize(request())


@pytest.mark.parametrize("pause", [0.05, 30.0], ids=["trickle", "stops-mid-body"])
async def test_an_answer_that_trickles_or_stops_mid_body_ends_at_the_timeout(pause: float) -> None:
    """A byte every 50 ms never trips a read timeout; the whole call's timeout ends it."""

    async def slow() -> AsyncIterator[bytes]:
        yield b'{"choices":[{"message":{"content":"'
        while True:
            await asyncio.sleep(pause)
            yield b"x"

    started = time.monotonic()
    with pytest.raises(SummarizerError, match="timed out"):
        await summarizer(Streamed(slow()), timeout=0.5).for_session("s", PAID).summarize(request())
    assert time.monotonic() - started < 3.0
