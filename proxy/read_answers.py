"""One answer's ``read_tool_output`` calls run against the store: the room shared between
them by need, a last-resort read from the answer's reserve when no view leaves read room,
and each read rendered (or searched, handle ``*``) in a worker thread within a time limit.
The loop's state and every decision about the window are ``ReadLoop``'s (sans-I/O); this is
the part that touches the store.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from policies.tokens import TokenCounter
from proxy.dialects.base import Answer
from proxy.read_loop import LAST_RESORT_TOKENS, LoopLimits, ReadLoop
from proxy.read_search import search_saved_outputs
from proxy.read_tool import SEARCH_ALL, BadArguments, ReadArguments, ReadResult, parse_arguments, render
from proxy.store import Store

# Below this many tokens of room, a read returns nothing but the advice to go on without it.
_MIN_READ_TOKENS = 48
# The room a read's "no room" answer needs; with less, the calls are dropped unanswered.
_SHORT_RESULT_TOKENS = 32
_NO_ROOM = "Error: no room is left in the context window for saved output; go on without it."


async def resolve_reads(loop: ReadLoop, store: Store, tenant: str, calls: list[Any], answer: Answer) -> None:
    """Run one answer's reads against the store and append them (with the calls) to the loop."""
    limits = loop.limits
    allowed = calls[: limits.max_calls_per_answer]
    loop.make_room(answer, calls)
    # The reads share the room by need: "no room" only when not even one short result fits.
    room = loop.room_total(answer, calls)
    last_resort = False
    if room < _MIN_READ_TOKENS:
        # The smallest view leaves no read room (a system prompt, tools and task that fill the
        # window): a short read may still use part of the answer's reserve, the answer keeping
        # at least half of it, rather than be refused. The read tool goes after it.
        room = min(LAST_RESORT_TOKENS, loop.room_total(answer, calls, hard=True))
        last_resort = room >= _MIN_READ_TOKENS
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
    outcomes = await _read_shared(loop, store, tenant, allowed, room)
    results: list[tuple[Any, str]] = []
    for position, call in enumerate(calls):
        if position >= len(allowed):
            outcome = ReadResult(
                f"Error: at most {limits.max_calls_per_answer} reads per answer; ask for the rest in your "
                "next answer.",
                "limited",
            )
        else:
            outcome = outcomes[position]
        loop.result.reads.append(outcome.outcome)
        loop.result.bytes_read += len(outcome.text.encode("utf-8", "replace"))
        results.append((call, outcome.text))
    if loop.result.bytes_read >= limits.max_total_bytes or room < _MIN_READ_TOKENS or last_resort:
        loop.exhausted = True
    loop.add_round(answer, results)


async def _read_shared(
    loop: ReadLoop, store: Store, tenant: str, calls: list[Any], room: int
) -> list[ReadResult]:
    """The reads of one answer sharing ``room`` tokens by need, not in equal parts: each is
    first rendered with all of it (at most the per-result cap); when together they do not fit,
    the reads smaller than an equal share keep what they need and the others share the rest
    (a search that found two lines never starves the page read beside it)."""
    cap = min(loop.limits.read.max_result_tokens, room)
    outcomes: list[ReadResult] = []
    before: list[int] = []  # bytes read by the request before each read (the byte limit holds)
    spent = loop.result.bytes_read
    for call in calls:
        before.append(spent)
        outcomes.append(await _read_one(loop, store, tenant, call, cap, spent))
        spent += len(outcomes[-1].text.encode("utf-8", "replace"))
    sizes = [loop.counter.count_text(o.text, loop.encoding) for o in outcomes]
    if sum(sizes) <= room or len(calls) < 2:
        return outcomes
    left, large = room, list(range(len(calls)))
    while large:
        share = left // len(large)
        small = [i for i in large if sizes[i] <= share]
        if not small:
            break
        left -= sum(sizes[i] for i in small)
        large = [i for i in large if i not in small]
    for index in large:
        outcomes[index] = await _read_one(
            loop, store, tenant, calls[index], left // len(large), before[index]
        )
    return outcomes


async def _read_one(
    loop: ReadLoop, store: Store, tenant: str, call: Any, room: int, bytes_read: int
) -> ReadResult:
    return await read_saved_output(
        store,
        tenant,
        loop.dialect.call_arguments(call),
        limits=loop.limits,
        room=room,
        counter=loop.counter,
        encoding=loop.encoding,
        bytes_read=bytes_read,
        handles=loop.handles,
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
    if room < _MIN_READ_TOKENS:
        return ReadResult(_NO_ROOM, "no_room")
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
