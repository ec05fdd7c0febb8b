"""The reads of a ``Read`` command against the store, run by the loop driver: each read rendered
(or searched, handle ``*``) in a worker thread within a time limit, and every way it can fail
told to the model as a result (``not_found``, ``expired``, ``store_error``, ``timeout``...)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import orjson

from policies.tokens import TokenCounter
from proxy.read_loop.answers import MIN_READ_TOKENS, NO_ROOM_NOW, ReadCall
from proxy.read_loop.commands import LoopLimits
from proxy.read_loop.loop import ReadLoop
from proxy.read_tool.search import search_saved_outputs
from proxy.read_tool.tool import SEARCH_ALL, BadArguments, ReadArguments, ReadResult, parse_arguments, render
from proxy.state.store import Store


async def run_reads(reads: Sequence[ReadCall], loop: ReadLoop, store: Store, tenant: str) -> list[ReadResult]:
    """A ``Read`` of ``loop`` against the store, in order."""
    return [
        await read_saved_output(
            store,
            tenant,
            read.arguments,
            limits=loop.limits,
            room=read.room,
            counter=loop.counter,
            encoding=loop.encoding,
            bytes_read=read.bytes_read,
            handles=loop.handles,
        )
        for read in reads
    ]


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
    handles: tuple[str, ...] = (),
) -> ReadResult:
    """One ``read_tool_output`` call: the result text and its outcome (``ok``, ``truncated``,
    ``not_found``, ``expired``, ``bad_arguments``, ``limited``, ``store_error``, ``timeout``).
    Handle ``*`` with a pattern searches every saved output of ``handles``."""
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
    if room < MIN_READ_TOKENS:
        # Its share of the answer's room is too small for any line: it says exactly what to ask
        # for later, so a read is never lost for being one of many.
        again = orjson.dumps(arguments if isinstance(arguments, dict) else orjson.loads(arguments)).decode()
        return ReadResult(f"{NO_ROOM_NOW} {again}", "no_room")
    if args.handle == SEARCH_ALL:
        try:
            return await _search(store, tenant, args, limits, room, counter, encoding, bytes_read, handles)
        except BadArguments as exc:
            return ReadResult(str(exc), "bad_arguments")
        except TimeoutError:
            return ReadResult("Error: the search took too long; use a simpler pattern.", "timeout")
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


async def _search(
    store: Store,
    tenant: str,
    args: ReadArguments,
    limits: LoopLimits,
    room: int,
    counter: TokenCounter,
    encoding: str,
    bytes_read: int,
    handles: tuple[str, ...],
) -> ReadResult:
    return await search_saved_outputs(
        store,
        tenant,
        args,
        handles,
        limits=replace(
            limits.read,
            max_result_bytes=max(256, min(limits.read.max_result_bytes, limits.max_total_bytes - bytes_read)),
        ),
        timeout_seconds=limits.timeout_seconds,
        room=room,
        counter=counter,
        encoding=encoding,
    )
