"""The durable store's interface: offloaded outputs, session checkpoints, compaction events.

One small interface (``Store``) with two implementations: SQLite under the state directory
(``sqlite_store.py``, the default) and Redis for replicas (``redis_store.py``). An offloaded
output is written before any view that names its handle is sent; expiry keeps data
``keep_days`` after its last use, then a tombstone for as long again, so reading an expired
handle says "expired" rather than "unknown".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from policies.pipeline import Checkpoint, Offload
from proxy.state.checkpoint_states import (
    CheckpointState,
)
from proxy.state.session_index import Resolution


@dataclass(frozen=True, slots=True)
class StoredOutput:
    handle: str
    content: str | None  # None: expired
    description: str

    @property
    def expired(self) -> bool:
        return self.content is None


class Store(Protocol):
    async def put_outputs(self, tenant: str, outputs: Sequence[Offload]) -> None: ...
    async def get_output(self, tenant: str, handle: str) -> StoredOutput | None: ...
    async def load_checkpoint(self, tenant: str, session: str) -> Checkpoint | None: ...
    async def save_checkpoint(self, tenant: str, session: str, checkpoint: Checkpoint) -> None: ...
    async def add_event(
        self, tenant: str, session: str, event: dict[str, Any], checkpoint: CheckpointState | None = None
    ) -> None: ...
    async def resolve_branch(
        self, tenant: str, root_key: str, root_session: str, digests: Sequence[str]
    ) -> Resolution: ...
    async def events(
        self,
        tenant: str | None,
        *,
        session: str | None = None,
        policy: str | None = None,
        since: float = 0.0,
        limit: int = 100,
        newest: bool = False,  # the newest ``limit`` events, newest first
    ) -> list[dict[str, Any]]: ...
    async def sessions(self, tenant: str | None, *, limit: int = 50) -> list[dict[str, Any]]:
        """The summaries (``proxy.state.session_rollup``) of the ``limit`` sessions with the
        newest events, newest first, kept as the events are written: bounded work a call."""
        ...

    async def expire(self, keep_seconds: float, now: float | None = None) -> int: ...
    async def swap_sent_at(self, tenant: str, session: str, at: float) -> float | None:
        """When the session's previous request went upstream (None: unknown), ``at`` kept as
        the last from now on."""
        ...

    async def secret(self, name: str, made: bytes) -> bytes:
        """The deployment's secret ``name``: the one kept, else ``made``, kept from now on (the
        first writer wins, so every process and replica of one store signs with one key)."""
        ...

    async def close(self) -> None: ...


_checkpoint_encoder = msgspec.json.Encoder()
_checkpoint_decoder = msgspec.json.Decoder(Checkpoint)


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    return _checkpoint_encoder.encode(checkpoint)


def decode_checkpoint(data: bytes) -> Checkpoint:
    return _checkpoint_decoder.decode(data)
