"""What a running app does when it starts and when it stops, and its background loops (store
expiry, token factors saved, ``malloc_trim``)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from proxy import package_version
from proxy.config.settings import Settings
from proxy.parts import AppParts
from proxy.state.memory import malloc_trim, trim_forever
from proxy.state.store_factory import describe_store


def prepare_state_dir(path: str) -> Path:
    """Create the state directory readable by its owner only (it will hold offloaded
    tool outputs, which can contain anything a tool printed)."""
    state = Path(path)
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(state, 0o700)
    return state


class Lifecycle:
    """What an app does when it starts and stops, and its background loops."""

    def __init__(self, settings: Settings, parts: AppParts, ready: asyncio.Event, log: Any) -> None:
        self.settings = settings
        self.parts = parts
        self.ready = ready
        self.log = log
        self.background: set[asyncio.Task[None]] = set()
        self.state_dir = os.path.abspath(settings.state_dir)  # for the start line

    async def expire_forever(self) -> None:
        keep = self.settings.store.keep_days * 86_400
        while True:
            await asyncio.sleep(self.settings.store.expiry_interval_seconds)
            try:
                cleared = await self.parts.store.expire(keep)
                self.log.info("store_expiry", outputs_expired=cleared)
            except Exception as exc:  # expiry retries at the next interval
                self.log.warning("store_expiry_failed", error=type(exc).__name__)

    async def save_factors_forever(self) -> None:
        while True:
            await asyncio.sleep(30)
            await asyncio.to_thread(self.parts.factors.save)

    def _spawn(self, work: Awaitable[None]) -> None:
        self.background.add(asyncio.ensure_future(work))

    async def startup(self) -> None:
        settings, parts = self.settings, self.parts
        prepare_state_dir(settings.state_dir)
        await asyncio.to_thread(parts.factors.load)
        self._spawn(self.save_factors_forever())
        # Loading a BPE table takes a few hundred ms: do it off the event loop, before ready.
        await asyncio.to_thread(parts.counter.warm_up)
        counter = parts.counter
        self.log.info("token_counter", encoding=counter.default_encoding, backend=counter.backend())
        try:
            await parts.store.expire(settings.store.keep_days * 86_400)  # also opens the store
        except Exception as exc:
            # A store that cannot even be read stops the start; one that cannot be written
            # (a full disk) starts: every write path fails open, reads keep working.
            await parts.store.events(None, limit=1)
            self.log.warning("store_expiry_failed", error=type(exc).__name__)
        self._spawn(self.expire_forever())
        if parts.span_export is not None:
            self._spawn(parts.span_export.export_forever())
        if parts.canary_judge is not None:
            self._spawn(parts.canary_judge.judge_forever())
        trim = malloc_trim() if settings.server.malloc_trim_seconds > 0 else None
        if trim is not None:
            self._spawn(trim_forever(trim, settings.server.malloc_trim_seconds))
        self.ready.set()
        self.log.info(
            "started",
            version=package_version(),
            listen=f"http://{settings.server.host}:{settings.server.port}",
            upstream=settings.upstream.base_url,
            anthropic=settings.anthropic.base_url,
            policy=settings.policy,
            mode=settings.mode,
            store=describe_store(settings),
            state_dir=self.state_dir,
            policies=sorted(parts.policies),
        )

    async def shutdown(self) -> None:
        parts = self.parts
        for task in self.background:
            task.cancel()
        await asyncio.gather(*self.background, *parts.service.background, return_exceptions=True)
        if parts.service.prepared is not None:
            await parts.service.prepared.drain()
        await asyncio.gather(*parts.shadow.tasks, return_exceptions=True)
        await parts.events.drain()
        if parts.span_export is not None:
            # The last spans go to the collector (bounded by the exporter's timeout).
            await parts.span_export.shutdown()
        await asyncio.to_thread(parts.factors.save)
        parts.large.close()
        await parts.store.close()
        await parts.upstream.aclose()
        if parts.summarizer is not None:
            await parts.summarizer.aclose()
