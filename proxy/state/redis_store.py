"""``Store`` on Redis (redis-py's asyncio client), so several proxy replicas behind a load
balancer share sessions, checkpoints, saved outputs and events.

Keys, all under ``cpx:``: ``out:<tenant>:<handle>`` (the output, written once with ``SET NX``,
kept ``keep_days`` after its last read), ``seen:<tenant>:<handle>`` (a marker kept twice as
long, so an expired handle answers "expired"), ``cp:<session>`` (tenant + checkpoint),
``ev:<tenant>`` and ``ev:*`` (sorted sets of event ids by time) and ``evd:<id>`` (the event).
Redis's own expiry does the cleaning; ``expire`` only trims the event indexes.

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
from proxy.state.store import StoredOutput, decode_checkpoint, encode_checkpoint

_ALL = "cpx:ev:*"
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
            await pipe.execute()

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
        while len(found) < limit:
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
        async for key in self.client.scan_iter(match="cpx:ev:t_*"):
            await self.client.zremrangebyscore(key, "-inf", cutoff)
        return 0

    async def close(self) -> None:
        await self.client.aclose()
