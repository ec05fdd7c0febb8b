"""``Store`` on Redis (redis-py's asyncio client), so several proxy replicas behind a load
balancer share sessions, checkpoints, saved outputs and events.

Keys, all under ``cpx:``: ``out:<tenant>:<handle>`` (the output, written once with ``SET NX``,
kept ``keep_days`` after its last read), ``seen:<tenant>:<handle>`` (a marker kept twice as
long, so an expired handle answers "expired"), ``cp:<session>`` (tenant + checkpoint),
``ev:<tenant>`` and ``ev:*`` (sorted sets of event ids by time) and ``evd:<id>`` (the event),
``ss:<tenant>:<session>`` (a hash: the session's summary, counted up as its events are added)
and ``sl:<tenant>`` and ``sl:*`` (sorted sets of sessions by their newest event). Redis's own
expiry does the cleaning; ``expire`` only trims the event and session indexes.

The control plane's work is bounded a call: the sessions list reads one hash a session shown,
an events page examines at most ``SCAN_BUDGET`` event ids however few match its filter.

Redis away must cost a request about a second at most, gone (connection refused) or hung
(connected, never answering): every command has a ``timeout`` to connect and to answer, one
immediate retry (a restarted server closed the pooled connections), and after a failure the
store pauses for ``PAUSE_SECONDS``, failing at once, so one request does not pay the timeout
for each of its store calls. The callers fail open (the request goes uncompacted).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

import msgspec
import orjson
import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from policies.pipeline import Checkpoint, Offload
from proxy.state.checkpoint_states import CheckpointState
from proxy.state.session_index import PrefixDigests, Resolution, decode_branches, encode_branches, resolve
from proxy.state.session_rollup import LATEST as _LATEST
from proxy.state.session_rollup import SUMS as _SUMS
from proxy.state.session_rollup import rollup
from proxy.state.store import StoredOutput, decode_checkpoint, encode_checkpoint

_ALL = "cpx:ev:*"
_ALL_SESSIONS = "cpx:sl:*"
# Event ids an events page examines at most (its filters may match few of them).
SCAN_BUDGET = 10_000
# After a failed command, every command fails at once for this long.
PAUSE_SECONDS = 1.0
_P = ParamSpec("_P")
_R = TypeVar("_R")


class RedisUnavailable(ConnectionError):
    """Redis failed a moment ago: the store is paused."""


def _guarded(
    method: Callable[Concatenate[RedisStore, _P], Coroutine[Any, Any, _R]],
) -> Callable[Concatenate[RedisStore, _P], Coroutine[Any, Any, _R]]:
    """Fail at once while the store is paused; pause it when Redis fails."""

    @functools.wraps(method)
    async def guarded(store: RedisStore, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        if time.monotonic() < store.paused_until:
            raise RedisUnavailable("Redis failed a moment ago")
        try:
            return await method(store, *args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            store.paused_until = time.monotonic() + PAUSE_SECONDS
            raise

    return guarded


def _as_bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


class RedisStore:
    def __init__(self, url: str, keep_seconds: float, timeout: float = 0.5) -> None:
        self.client = redis.Redis.from_url(
            url,
            decode_responses=False,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 1),
        )
        self.keep = max(1, int(keep_seconds))
        self.paused_until = 0.0

    @_guarded
    async def put_outputs(self, tenant: str, outputs: Sequence[Offload]) -> None:
        async with self.client.pipeline(transaction=False) as pipe:
            for output in outputs:
                value = orjson.dumps({"content": output.content, "description": output.description})
                pipe.set(f"cpx:out:{tenant}:{output.handle}", value, ex=self.keep, nx=True)
                pipe.set(f"cpx:seen:{tenant}:{output.handle}", b"1", ex=2 * self.keep)
            await pipe.execute()

    @_guarded
    async def get_output(self, tenant: str, handle: str) -> StoredOutput | None:
        key = f"cpx:out:{tenant}:{handle}"
        raw = await self.client.get(key)
        if raw is None:
            if await self.client.exists(f"cpx:seen:{tenant}:{handle}"):
                return StoredOutput(handle=handle, content=None, description="")
            return None
        await self.client.expire(key, self.keep)  # kept keep_days after its last use
        data = orjson.loads(raw)
        return StoredOutput(handle=handle, content=data["content"], description=data["description"])

    @_guarded
    async def secret(self, name: str, made: bytes) -> bytes:
        key = f"cpx:secret:{name}"
        await self.client.set(key, made, nx=True)  # never expires: items signed with it live on
        return _as_bytes(await self.client.get(key))

    @_guarded
    async def swap_sent_at(self, tenant: str, session: str, at: float) -> float | None:
        """The session's last send by any replica, swapped for ``at`` in one command."""
        old = await self.client.set(f"cpx:sent:{session}", f"{tenant}\x1f{at!r}", ex=self.keep, get=True)
        owner, _, value = _as_bytes(old).decode().partition("\x1f") if old is not None else ("", "", "")
        try:
            return float(value) if owner == tenant else None
        except ValueError:
            return None  # written by something else: no previous send known

    @_guarded
    async def load_checkpoint(self, tenant: str, session: str) -> Checkpoint | None:
        raw = await self.client.get(f"cpx:cp:{session}")
        if raw is None:
            return None
        owner, _, data = _as_bytes(raw).partition(b"\x1f")
        if owner.decode() != tenant:
            return None
        try:
            return decode_checkpoint(data)
        except msgspec.DecodeError:
            return None

    @_guarded
    async def save_checkpoint(self, tenant: str, session: str, checkpoint: Checkpoint) -> None:
        value = tenant.encode() + b"\x1f" + encode_checkpoint(checkpoint)
        await self.client.set(f"cpx:cp:{session}", value, ex=self.keep)

    @_guarded
    async def resolve_branch(
        self, tenant: str, root_key: str, root_session: str, digests: Sequence[str]
    ) -> Resolution:
        """The session of a request (``proxy.state.session_index``), shared by every replica: an
        optimistic transaction on the root's key, retried when another replica wrote it."""
        key = f"cpx:br:{tenant}:{root_key}"
        prefixes = PrefixDigests(digests)
        async with self.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    raw = await pipe.get(key)
                    branches = decode_branches(_as_bytes(raw) if raw is not None else None)
                    resolution = resolve(branches, root_session, prefixes)
                    pipe.multi()  # type: ignore[no-untyped-call]
                    pipe.set(key, encode_branches(branches), ex=self.keep)
                    await pipe.execute()
                    return resolution
                except redis.WatchError:
                    continue

    @_guarded
    async def add_event(
        self, tenant: str, session: str, event: dict[str, Any], checkpoint: CheckpointState | None = None
    ) -> None:
        """The event whole: Redis expires each key on its own, so a template kept apart could
        go before an event that refers to it (``checkpoint`` is not used)."""
        event_id = event["event_id"]
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.set(f"cpx:evd:{event_id}", msgspec.json.encode(event), ex=self.keep)
            pipe.zadd(f"cpx:ev:{tenant}", {event_id: float(event["time"])})
            pipe.zadd(_ALL, {event_id: float(event["time"])})
            self._count_session(pipe, tenant, session, event)
            await pipe.execute()

    def _count_session(self, pipe: Any, tenant: str, session: str, event: dict[str, Any]) -> None:
        """The session's summary counted up in the event's own transaction: sums by
        ``HINCRBY``, the newest event's fields by ``HSET`` (a session's events come in order)."""
        one = rollup(session, event)
        key = f"cpx:ss:{tenant}:{session}"
        for name in _SUMS:
            if one[name]:  # a figure never counted reads as 0
                pipe.hincrby(key, name, one[name])
        for model, tokens in one["saved_by_model"]:
            pipe.hincrby(key, _SAVED + (model if model is not None else _NO_MODEL), tokens)
        pipe.hsetnx(key, "first", one["first"])
        # The request number is the newest request's: a preparation's own event has none.
        names = (*_LATEST, "last", "requests") if one["events"] else (*_LATEST, "last")
        latest = {name: one[name] for name in names if one[name] is not None}
        pipe.hset(key, mapping=latest)
        pipe.expire(key, self.keep)
        pipe.zadd(f"cpx:sl:{tenant}", {session: one["last"]})
        pipe.zadd(_ALL_SESSIONS, {f"{tenant}\x1f{session}": one["last"]})

    @_guarded
    async def sessions(self, tenant: str | None, *, limit: int = 50) -> list[dict[str, Any]]:
        """The ``limit`` sessions with the newest events, newest first: one hash read each."""
        index = f"cpx:sl:{tenant}" if tenant is not None else _ALL_SESSIONS
        members = [_as_bytes(m).decode() for m in await self.client.zrevrange(index, 0, limit - 1)]
        keys = [(tenant, m) if tenant is not None else tuple(m.split("\x1f", 1)) for m in members]
        async with self.client.pipeline(transaction=False) as pipe:
            for owner, session in keys:
                pipe.hgetall(f"cpx:ss:{owner}:{session}")
            found = await pipe.execute()
        return [_summary(session, raw) for (_, session), raw in zip(keys, found, strict=True) if raw]

    @_guarded
    async def events(
        self,
        tenant: str | None,
        *,
        session: str | None = None,
        policy: str | None = None,
        since: float = 0.0,
        limit: int = 100,
        newest: bool = False,
    ) -> list[dict[str, Any]]:
        index = f"cpx:ev:{tenant}" if tenant is not None else _ALL
        found: list[dict[str, Any]] = []
        start = 0
        while len(found) < limit and start < SCAN_BUDGET:
            ids: list[Any] = await (
                self.client.zrevrangebyscore(index, "+inf", since, start=start, num=500)
                if newest
                else self.client.zrangebyscore(index, since, "+inf", start=start, num=500)
            )
            if not ids:
                break
            start += len(ids)
            for raw in await self.client.mget([b"cpx:evd:" + _as_bytes(i) for i in ids]):
                if raw is None:
                    continue
                event = orjson.loads(raw)
                if session is not None and not (
                    event["session"] == session or event["session"].startswith(session + ":")
                ):
                    continue
                if policy is not None and event.get("policy") != policy:
                    continue
                found.append(event)
                if len(found) >= limit:
                    break
        return found

    @_guarded
    async def expire(self, keep_seconds: float, now: float | None = None) -> int:
        cutoff = (time.time() if now is None else now) - keep_seconds
        await self.client.zremrangebyscore(_ALL, "-inf", cutoff)
        await self.client.zremrangebyscore(_ALL_SESSIONS, "-inf", cutoff)
        for pattern in ("cpx:ev:t_*", "cpx:sl:t_*"):
            async for key in self.client.scan_iter(match=pattern):
                await self.client.zremrangebyscore(key, "-inf", cutoff)
        return 0

    async def close(self) -> None:
        await self.client.aclose()


_SAVED = "saved\x1f"
_NO_MODEL = "\x00"  # the tokens saved by events that named no model


def _summary(session: str, raw: dict[Any, Any]) -> dict[str, Any]:
    """A session's summary hash as the rollup ``proxy.state.session_rollup`` makes."""
    fields = {_as_bytes(k).decode(): _as_bytes(v).decode() for k, v in raw.items()}
    row: dict[str, Any] = {"session": session, **{name: fields.get(name) for name in _LATEST}}
    row["first"], row["last"] = float(fields.get("first", 0)), float(fields.get("last", 0))
    row.update({name: int(fields.get(name, 0)) for name in _SUMS})
    row["requests"] = max(int(fields.get("requests", 0)), row["events"])
    row["saved_by_model"] = [
        [None if name == _SAVED + _NO_MODEL else name.removeprefix(_SAVED), int(value)]
        for name, value in fields.items()
        if name.startswith(_SAVED)
    ]
    return row
