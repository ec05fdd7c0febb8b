"""Transcripts: the messages a summary replaces, saved verbatim under one handle.

A summary keeps the story and the ledger keeps exact facts (commands, exit codes, first error
lines), but a small tool output folded into a summary (a test count, the last line a script
printed) was saved nowhere. With transcripts (a summarizing stage's ``save_transcript``), each
compaction saves the messages it covers, in order, rendered to be read and searched: each
message's role and client index, its text, its tool calls (id, name, arguments: short fields on
one line, long strings verbatim, never JSON-escaped), tool results in full. A message the view
had already replaced (an offloaded output's placeholder, an edit's argument placeholders, an
excerpt, a retry note) is kept as it was sent: its full text is saved under the handle it names,
so nothing is saved twice. A later compaction's transcript holds only the messages newly
summarized and names the previous transcript's handle; the ledger lists every transcript in
order, so the oldest stays reachable. However long, a transcript is one handle:
``read_tool_output`` pages it and searches it by pattern.

Pure and deterministic: the same messages give the same text, hence the same handle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from policies.artifacts import saved_text
from policies.conversation import Message, message_text, parse, role
from policies.handles import mention, new_handle
from policies.ledger_records import TranscriptRecord
from policies.tokens import json_text

TRANSCRIPT_HEADER = "[Transcript saved by the context manager: the messages a summary replaced, verbatim]"


@dataclass(frozen=True, slots=True)
class Transcript:
    """One compaction's transcript: ``text`` is saved under ``record.handle``."""

    text: str
    record: TranscriptRecord

    @property
    def handle(self) -> str:
        return self.record.handle

    def description(self) -> str:
        r = self.record
        lines = self.text.count("\n") + 1
        return (
            f"transcript: client messages {r.first}-{r.last} verbatim, in order ({r.messages} messages, "
            f"{r.steps} step{'s' * (r.steps != 1)}) | {lines} lines, {len(self.text)} chars"
        )


def _call_text(call: Any) -> str:
    """A tool call, readable: its id, then the whole call (``saved_text``'s layout)."""
    function = call.get("function") if isinstance(call, dict) else None
    call_id = call.get("id") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return f"--- call {call_id} ---\n{json_text(call)}"
    name = str(function.get("name") or "?")
    arguments = function.get("arguments")
    parsed: Any = arguments
    if isinstance(arguments, str):
        try:
            parsed = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            parsed = arguments
    if isinstance(parsed, dict):
        body = saved_text(name, parsed)
    elif isinstance(parsed, str):
        body = f"{name}:\n{parsed}" if "\n" in parsed else f"{name}({parsed})"
    else:
        body = f"{name}({json_text(parsed)})"
    return f"--- call {call_id} ---\n{body}"


def _message_text(message: Message, origin: int) -> str:
    kind = role(message) or "?"
    where = f"message {origin}" if origin >= 0 else "inserted message"
    label = kind
    if kind == "tool":
        name = message.get("name")
        label = f"tool result for {message.get('tool_call_id')}" + (f" ({name})" if name else "")
    parts = [f"=== {where} | {label} ==="]
    text = message_text(message)
    if text:
        parts.append(text)
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    if isinstance(calls, list):
        parts += [_call_text(call) for call in calls]
    return "\n".join(parts)


def build_transcript(
    messages: Sequence[Message],
    origins: Sequence[int],
    earlier: str | None = None,
    older: Sequence[TranscriptRecord] = (),
) -> Transcript | None:
    """The transcript of ``messages`` (client indices ``origins``, -1 for an inserted one),
    naming ``earlier``, the previous transcript's handle, and every ``older`` transcript (so
    one read of the newest reaches all of them, however short the ledger's list is); None when
    there is nothing to save."""
    if not messages:
        return None
    known = [o for o in origins if o >= 0]
    first, last = (min(known), max(known)) if known else (-1, -1)
    lines = [TRANSCRIPT_HEADER, f"Client messages {first}-{last}, {len(messages)} messages, oldest first."]
    if earlier:
        lines.append(f"The messages before these are in the previous transcript: {mention(earlier)}.")
    if len(older) > 1:
        lines.append("Every earlier transcript, oldest first:")
        lines += [f"- messages {r.first}-{r.last}: {mention(r.handle)}" for r in older]
    lines.append(
        "A message that was already replaced by a placeholder is kept as it was sent: "
        "read its full text under the handle it names."
    )
    body = "\n\n".join(_message_text(m, o) for m, o in zip(messages, origins, strict=True))
    text = "\n".join(lines) + "\n\n" + body + "\n"
    record = TranscriptRecord(
        handle=new_handle(text),
        first=first,
        last=last,
        messages=len(messages),
        steps=len(parse(messages).steps),
        chars=len(text),
    )
    return Transcript(text=text, record=record)
