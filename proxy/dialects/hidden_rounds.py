"""The read rounds a client never saw, put back where they happened (Anthropic Messages).

When the model reads saved outputs, the proxy answers ``read_tool_output`` itself and asks
again; the client gets the last round's answer only. With thinking on, that is not enough:
Claude's API wants an assistant message echoed exactly as it was produced, the current turn's
last assistant message to start with its thinking, and on newer models every thinking block
bound to what came before it. So once a read loop ends in an answer with tool calls, the proxy
keeps the rounds (each read call with its results) and the answer exactly as the model wrote
it, under the answer's first ``tool_use`` id; when a later request of the tenant echoes that
answer, it is replaced by what really happened before it goes upstream (and to the policies,
which may compact it like any other step).

Kept in memory (bounded by bytes, least recently used first) and, when several processes
serve one tenant (workers, or replicas on Redis), in the store, where a process that has not
seen a round looks up the last answer of a request.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections import OrderedDict
from typing import Any

import orjson

from policies.pipeline import Offload
from proxy.state.store import Store

DESCRIPTION = "read rounds the client did not see"


def _key(tenant: str, call_id: str) -> str:
    return f"{tenant}\x1f{call_id}"


def _handle(tenant: str, call_id: str) -> str:
    """The store's name for a kept round (the store is tenant-scoped already)."""
    digest = hashlib.blake2b(("hidden-rounds:" + call_id).encode(), digest_size=8).hexdigest()
    return "out_" + digest


def first_call_id(content: Any) -> str | None:
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict) and block.get("type") == "tool_use" and isinstance(block.get("id"), str):
            return str(block["id"])
    return None


class HiddenRounds:
    def __init__(self, store: Store, *, shared: bool, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.store = store
        self.shared = shared
        self.max_bytes = max_bytes
        self._kept: OrderedDict[str, tuple[list[Any], int]] = OrderedDict()
        self._bytes = 0

    def _remember(self, key: str, messages: list[Any], size: int) -> None:
        if key in self._kept:
            self._bytes -= self._kept.pop(key)[1]
        self._kept[key] = (messages, size)
        self._bytes += size
        while self._bytes > self.max_bytes and self._kept:
            self._bytes -= self._kept.popitem(last=False)[1][1]

    async def record(self, tenant: str, rounds: list[Any], answer: list[Any]) -> None:
        """Keep ``rounds`` (the messages the read loop added) and the ``answer`` as written, under
        the answer's first tool_use id (an answer without one ends the turn: nothing to keep)."""
        call_id = first_call_id(answer)
        if call_id is None or not rounds:
            return
        messages = [*rounds, {"role": "assistant", "content": answer}]
        data = orjson.dumps(messages)
        self._remember(_key(tenant, call_id), messages, len(data))
        if self.shared:
            # A store that is down costs only the other processes' copy: this one keeps it.
            with contextlib.suppress(Exception):
                await self.store.put_outputs(
                    tenant, [Offload(_handle(tenant, call_id), data.decode(), DESCRIPTION)]
                )

    async def _lookup(self, tenant: str, call_id: str, from_store: bool) -> list[Any] | None:
        found = self._kept.get(_key(tenant, call_id))
        if found is not None:
            self._kept.move_to_end(_key(tenant, call_id))
            return found[0]
        if not (from_store and self.shared):
            return None
        try:
            stored = await self.store.get_output(tenant, _handle(tenant, call_id))
        except Exception:  # the store is down: the request goes as the client sent it
            return None
        if stored is None or stored.content is None:
            return None
        messages: list[Any] = orjson.loads(stored.content)
        self._remember(_key(tenant, call_id), messages, len(stored.content))
        return messages

    def active(self) -> bool:
        """Whether a body could have anything to restore (nothing kept here or in a store)."""
        return bool(self._kept) or self.shared

    async def lookup(self, tenant: str, wanted: list[tuple[str, bool]]) -> dict[str, list[Any]]:
        """The kept rounds of each ``(call id, from the store too)`` that has some."""
        found: dict[str, list[Any]] = {}
        for call_id, from_store in wanted:
            rounds = await self._lookup(tenant, call_id, from_store)
            if rounds is not None:
                found[call_id] = rounds
        return found

    async def restore(self, tenant: str, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """``body`` with every echoed answer of a read loop replaced by its rounds and the answer
        as written; how many were restored."""
        if not self.active():
            return body, 0
        wanted = echoed_answers(body)
        if not wanted:
            return body, 0
        return splice_rounds(body, await self.lookup(tenant, wanted))


def echoed_answers(body: Any) -> list[tuple[str, bool]]:
    """The first tool_use id of each assistant message of ``body``, and whether to look in the
    store for it too (the last assistant message only: an answer another process wrote)."""
    wire = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(wire, list):
        return []
    found: list[tuple[str, bool]] = []
    for message in wire:
        if isinstance(message, dict) and message.get("role") == "assistant":
            call_id = first_call_id(message.get("content"))
            found.append((call_id or "", False))
    if found:
        found[-1] = (found[-1][0], True)
    return [(call_id, from_store) for call_id, from_store in found if call_id]


def splice_rounds(body: dict[str, Any], found: dict[str, list[Any]]) -> tuple[dict[str, Any], int]:
    """``body`` with each assistant message whose first tool_use id is in ``found`` replaced by
    those messages (the rounds and the answer as written); how many were replaced."""
    if not found:
        return body, 0
    restored: list[Any] = []
    count = 0
    for message in body["messages"]:
        if isinstance(message, dict) and message.get("role") == "assistant":
            rounds = found.get(first_call_id(message.get("content")) or "")
            if rounds is not None:
                restored.extend(rounds)
                count += 1
                continue
        restored.append(message)
    return ({**body, "messages": restored}, count) if count else (body, 0)
