"""How ``compaction-proxy events`` prints: a table for a person at a terminal, JSON lines for
a program (a pipe, a file, ``--json``).

The table has one row per event with fixed column widths, so that rows printed later by
``--follow`` line up under the header printed first. The session column shows the client's own
``X-Session-Id`` where the event has one (bounded and without control characters, whatever the
store holds), else the proxy's ``s_...`` id cut short; its policy suffix is the policy column.
``OWN TOKENS`` is the compaction's own cost (``proxy/telemetry/compaction_cost.py``): the
summarizer's input/output tokens of the point, apart from the prompt; a summary prepared ahead
has a row of its own (``prepared`` where a request's trigger is), with its tokens.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

import orjson

from proxy.state.sessions import client_session_label

# (header, width, right-aligned)
COLUMNS = (
    ("TIME", 14, False),
    ("SESSION", 30, False),  # a wrap run's id (27 characters) whole, to paste into --session
    ("POLICY", 16, False),
    ("TRIGGER", 10, False),
    ("TOKENS BEFORE -> AFTER", 22, True),
    ("READS", 5, True),
    ("OFFLOADED", 9, True),
    ("OWN TOKENS", 15, True),
)


def fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def session_of(event: Mapping[str, Any]) -> str:
    client = event.get("client_session")
    if isinstance(client, str) and client:
        return client_session_label(client)
    session = str(event.get("session") or "-")
    internal = session.split(":", 1)[0]
    return internal[:10] + "\u2026" if internal.startswith("s_") and len(internal) > 11 else internal


def _count(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) else "-"


def _own(event: Mapping[str, Any]) -> str:
    spent = event.get("compaction_cost")
    if not isinstance(spent, Mapping) or not (spent.get("input_tokens") or spent.get("output_tokens")):
        return "-"
    return f"{_count(spent.get('input_tokens'))}/{_count(spent.get('output_tokens'))}"


def row(event: Mapping[str, Any]) -> list[str]:
    moment = event.get("time")
    when = time.strftime("%m-%d %H:%M:%S", time.localtime(float(moment))) if moment else "-"
    reads = event.get("read_tool_output")
    read_count = len(reads.get("reads") or ()) if isinstance(reads, Mapping) else 0
    handles = event.get("handles_offloaded")
    return [
        when,
        session_of(event),
        str(event.get("policy") or "-"),
        # A preparation's own event (no request: no trigger, no tokens sent) says what it is.
        str(event.get("trigger") or ("prepared" if event.get("kind") == "preparation" else "-")),
        f"{_count(event.get('tokens_before'))} -> {_count(event.get('tokens_after'))}",
        str(read_count),
        str(len(handles) if isinstance(handles, list) else 0),
        _own(event),
    ]


def line(cells: list[str]) -> str:
    parts = []
    for cell, (_, width, right) in zip(cells, COLUMNS, strict=True):
        text = fit(cell, width)
        parts.append(f"{text:>{width}}" if right else f"{text:<{width}}")
    return "  ".join(parts).rstrip()


class EventPrinter:
    """Writes events to ``out`` as table rows (the header before the first) or JSON lines."""

    def __init__(self, out: TextIO, table: bool) -> None:
        self.out = out
        self.table = table
        self._header_done = False

    def write(self, events: Iterable[Mapping[str, Any]]) -> None:
        for event in events:
            if not self.table:
                self.out.write(orjson.dumps(event).decode() + "\n")
                continue
            if not self._header_done:
                self.out.write(line([name for name, _, _ in COLUMNS]) + "\n")
                self._header_done = True
            self.out.write(line(row(event)) + "\n")
        self.out.flush()
