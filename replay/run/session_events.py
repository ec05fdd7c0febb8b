"""A replayed session's events, read from the proxy's events API, and what the replay takes
from them: its compaction points (the decisions the questions are checked against) and the
summarizer's tokens (the compaction's own cost, ``proxy/telemetry/compaction_cost.py``).

The read asks the proxy to wait for the session's summaries being prepared ahead first
(``x-compaction-prepared: wait``, the header the replay's steps send): the proxy settles them
and writes their events before it answers, so a preparation that finishes after the session's
last request is read too, the same every run, not only when it happens to be quick.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import httpx

from replay.run.parts import CasePart


async def read_session_events(
    http: httpx.AsyncClient, proxy_url: str, session: str, token: str, tenant: str | None, expected: int = 0
) -> list[dict[str, Any]] | str:
    """The session's events, or what went wrong; with ``expected`` compaction points, read
    again briefly until they are all written (events are written in the background)."""
    events: list[dict[str, Any]] = []
    params: dict[str, str | int] = {"session": session, "limit": 1000}
    if tenant is not None:
        params["tenant"] = tenant
    headers = {"authorization": f"Bearer {token}", "x-compaction-prepared": "wait"}
    for _ in range(40):
        response = await http.get(proxy_url + "/v1/compaction/events", params=params, headers=headers)
        if response.status_code != 200:
            return f"events: HTTP {response.status_code}"
        events = response.json().get("data") or []
        if sum(1 for e in events if e.get("trigger")) >= expected:
            break
        await asyncio.sleep(0.05)
    return events


def add_cost(part: CasePart, events: Iterable[dict[str, Any]]) -> None:
    """The summarizer's tokens the events carry: their points' on their requests' events, each
    preparation's (used or not) on its own event; each spend on exactly one event."""
    for event in events:
        own = event.get("compaction_cost")
        if isinstance(own, dict):
            part.summarizer_input_tokens += int(own.get("input_tokens") or 0)
            part.summarizer_output_tokens += int(own.get("output_tokens") or 0)


def add_decisions(part: CasePart, events: Iterable[dict[str, Any]]) -> None:
    """The session's compaction points: what each decided, and the summary each used."""
    for event in events:
        if not event.get("trigger"):
            continue  # a request under the trigger, or a preparation's own event
        part.compaction_events += 1
        summary = event.get("summary")
        part.decisions.append(
            {
                "trigger": event["trigger"],
                "covered": (event.get("parent_range") or {}).get("messages"),
                "handles": sorted(event.get("handles_offloaded") or []),
                "summary_hash": (summary or {}).get("hash"),
                "tokens_after": event.get("tokens_after"),
            }
        )
        if isinstance(summary, dict):
            part.summaries += 1
            model = summary.get("model") or "?"
            part.summary_kinds.append(str(model))
            if model != "ledger":
                part.summarizer_model_calls += 1
