"""The scripted reader: the recorded upstream playing a model that reads saved outputs back.

At a question point whose view lacks some evidence, the reader answers as a model would that
knows what it is looking for: it first searches every saved output at once (handle ``*``), then
calls ``read_tool_output`` on every handle the view names (several calls per answer, as many
rounds as the proxy allows), each call searching with a
``pattern`` for the missing evidence lines and for the handles a saved text names (a
transcript names the one before it, a cut ledger the complete one), so it follows them in
the next round. Whatever the proxy answers is what counts: evidence is *read back* only when
a read result, sent by the running proxy within its limits and window, holds it. Whether a
model would search that well is what the answering arms measure; this measures whether the
proxy's promise (a named handle can be read back) holds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from policies.conversation import Message, message_text
from policies.handles import PATTERN

READ_TOOL = "read_tool_output"
# The handle that searches every saved output of the conversation at once.
SEARCH_ALL = "*"
# Reads per answer: the proxy's own default limit (``read_tool.max_calls_per_answer``).
CALLS_PER_ANSWER = 8
# The longest evidence prefix searched for (a pattern is at most 500 characters).
_SEARCH_CHARS = 60
_META = re.compile(r"([\\.^$|?*+()\[\]{}])")
_NO_ROOM = "no room is left in the context window"


def _literal(text: str) -> str:
    """``text`` as an RE2 pattern matching it literally."""
    return _META.sub(r"\\\1", text)


def search_pattern(evidence: Sequence[str], *, handles: bool = True) -> str:
    """One pattern for the missing evidence lines (their first characters) and, with
    ``handles``, handle mentions (to follow them)."""
    parts = [_literal(item.strip().splitlines()[0][:_SEARCH_CHARS]) for item in evidence if item.strip()]
    return "|".join([*dict.fromkeys(parts), *([r"handle=out_[0-9a-f]{16}"] if handles else [])])


@dataclass(slots=True)
class Reader:
    """One question's reads: what it still looks for, what it read, and what came back."""

    evidence: tuple[str, ...]
    missing: list[str] = field(default_factory=list)
    read_handles: set[str] = field(default_factory=set)
    pending: list[str] = field(default_factory=list)
    results: list[str] = field(default_factory=list)
    calls: int = 0
    rounds: int = 0
    no_room: int = 0
    started: bool = False
    searched: bool = False
    _call_ids: set[str] = field(default_factory=set)

    def found(self) -> list[str]:
        """The missing evidence strings some read result holds."""
        return [item for item in self.missing if any(item in text for text in self.results)]

    def answer(self, messages: Sequence[Message], tools: Sequence[str], view_text: str) -> Message | None:
        """The reader's next answer (read calls), or None when it is done reading."""
        if not self.started:
            self.started = True
            self.missing = [item for item in self.evidence if item not in view_text]
            self._queue(view_text)
        else:
            self._take_results(messages)
        if not self.missing or len(self.found()) == len(self.missing):
            return None
        if READ_TOOL not in tools or not (self.pending or not self.searched):
            return None
        wanted = [m for m in self.missing if m not in self.found()]
        if not self.searched:
            # First one search across every saved output (handle "*"), as a model that knows
            # the line it wants would ask; then handle by handle.
            self.searched = True
            batch, pattern = [SEARCH_ALL], search_pattern(wanted, handles=False)
        else:
            batch, self.pending = self.pending[:CALLS_PER_ANSWER], self.pending[CALLS_PER_ANSWER:]
            pattern = search_pattern(wanted)
        calls = []
        for handle in batch:
            call_id = f"call_read_{self.calls}"
            self.calls += 1
            self._call_ids.add(call_id)
            arguments = orjson.dumps({"handle": handle, "pattern": pattern}).decode()
            calls.append(
                {"id": call_id, "type": "function", "function": {"name": READ_TOOL, "arguments": arguments}}
            )
        self.rounds += 1
        return {"role": "assistant", "content": None, "tool_calls": calls}

    def _queue(self, text: str) -> None:
        for handle in dict.fromkeys(PATTERN.findall(text)):
            if handle not in self.read_handles:
                self.read_handles.add(handle)
                self.pending.append(handle)

    def _take_results(self, messages: Sequence[Message]) -> None:
        for message in messages:
            if message.get("role") != "tool" or message.get("tool_call_id") not in self._call_ids:
                continue
            self._call_ids.discard(str(message.get("tool_call_id")))
            text = message_text(message)
            if _NO_ROOM in text:
                self.no_room += 1
            self.results.append(text)
            self._queue(text)

    def figures(self) -> dict[str, Any]:
        return {"read_calls": self.calls, "read_rounds": self.rounds, "no_room_reads": self.no_room}
