"""A session checkpoint as its events share it.

Between compaction points a session's checkpoint changes only its request counter, yet every
event holds the whole checkpoint (kilobytes once outputs are offloaded or a summary exists).
Its JSON is therefore kept as a *template*: the checkpoint encoded with a sentinel request
count, named by the digest of those bytes. A store may keep each template once and give each
event only ``[digest, requests]``; ``CheckpointState.json`` and ``expand`` turn either back
into the exact bytes the event would have held.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

# A request count no session reaches, written into a template where the count goes.
SENTINEL_REQUESTS = -739_201_557
SENTINEL_JSON = b'"requests":-739201557'
# The key an event stored by reference carries instead of its checkpoint.
REFERENCE_KEY = "checkpoint_state"
# How often a store writes a template's time again while events keep referring to it. Expiry
# keeps templates this much longer than events, so no kept event loses its checkpoint.
STATE_REFRESH_SECONDS = 3600.0


def template_digest(template: bytes) -> str:
    return hashlib.blake2b(template, digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class CheckpointState:
    """One event's checkpoint: the session's current template and this request's count."""

    digest: str
    template: bytes
    requests: int

    def json(self) -> bytes:
        return filled(self.template, self.requests)


def filled(template: bytes, requests: int) -> bytes:
    return template.replace(SENTINEL_JSON, b'"requests":%d' % requests, 1)


def by_reference(event: Mapping[str, Any], state: CheckpointState) -> dict[str, Any]:
    """The event as a store that keeps templates apart records it."""
    return {**event, "checkpoint": None, REFERENCE_KEY: [state.digest, state.requests]}


def references(events: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """The (tenant, template digest) pairs these stored events refer to."""
    found: set[tuple[str, str]] = set()
    for event in events:
        reference, tenant = event.get(REFERENCE_KEY), event.get("tenant")
        if isinstance(reference, list) and reference and isinstance(reference[0], str):
            found.add((str(tenant), reference[0]))
    return found


def expand(events: list[dict[str, Any]], templates: Mapping[tuple[str, str], bytes]) -> None:
    """Give each stored event that refers to a template its whole checkpoint back, in place
    (a template no longer stored leaves the checkpoint null and says so)."""
    for event in events:
        reference = event.pop(REFERENCE_KEY, None)
        if not isinstance(reference, list) or len(reference) != 2:
            continue
        digest, requests = reference
        template = templates.get((str(event.get("tenant")), digest)) if isinstance(digest, str) else None
        if template is None or not isinstance(requests, int):
            event["checkpoint_missing"] = True
            continue
        event["checkpoint"] = msgspec.json.decode(filled(template, requests))


class TemplateWrites:
    """Which templates a store writes with its events: each one once, and again when its last
    write is ``STATE_REFRESH_SECONDS`` old (bounded to ``remembered`` templates; one forgotten
    is only written again)."""

    def __init__(self, remembered: int = 10_000) -> None:
        self.remembered = remembered
        self._written: OrderedDict[tuple[str, str], float] = OrderedDict()

    def row(self, tenant: str, state: CheckpointState, now: float) -> tuple[str, str, float, bytes] | None:
        """The template's row to write with this event, or None when it was written lately."""
        key = (tenant, state.digest)
        written = self._written.get(key)
        if written is not None and now - written < STATE_REFRESH_SECONDS:
            return None
        self._written[key] = now
        self._written.move_to_end(key)
        while len(self._written) > self.remembered:
            self._written.popitem(last=False)
        return (tenant, state.digest, now, state.template)

    def forget(self) -> None:
        """A batch that failed may have lost its templates: each is written again."""
        self._written.clear()
