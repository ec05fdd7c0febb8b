"""Server-sent events split from a byte stream incrementally, in linear time and bounded memory.

An upstream that answers a read round with one 100 MB line and no blank line must not make the
proxy re-split a growing buffer on every chunk (quadratic: 40 s on the event loop for 100 MB).
The framer normalizes line ends once per byte (a ``\\r`` at a chunk's end waits for the next
chunk), scans each byte for the blank line that ends an event about once, and refuses an event
larger than ``max_event_bytes`` with ``EventTooLarge``.
"""

from __future__ import annotations

from typing import Any

import orjson


def event_data(event: bytes) -> bytes:
    """The data of one event (``\n`` line ends): its ``data:`` lines joined; the usual
    one-line event without splitting it."""
    if event.startswith(b"data: ") and b"\n" not in event:
        return event[6:]
    return b"".join(line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:"))


def typed_event(payload: dict[str, Any]) -> bytes:
    """An event named by its payload's ``type``, as the Responses and Messages APIs write them."""
    return b"event: " + str(payload.get("type")).encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def recorded_events(raw: bytes) -> list[bytes]:
    """The events of a whole recorded stream (for shadow comparisons and usage reads)."""
    return raw.replace(b"\r\n", b"\n").split(b"\n\n")


class EventTooLarge(Exception):
    """The upstream's event grew past the limit without ending."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"an event stream event larger than {limit} bytes")
        self.limit = limit


class SSEFramer:
    def __init__(self, max_event_bytes: int) -> None:
        self.max_event_bytes = max_event_bytes
        self._buffer = bytearray()
        self._scanned = 0  # bytes of the buffer already searched for a blank line
        self._carry = b""  # a trailing "\r" that may start a "\r\n" in the next chunk

    def feed(self, chunk: bytes) -> list[bytes]:
        """The events ``chunk`` completes (each without its blank line, ``\\n`` line ends)."""
        data = self._carry + chunk
        self._carry = b""
        if data.endswith(b"\r"):
            data, self._carry = data[:-1], b"\r"
        self._buffer += data.replace(b"\r\n", b"\n")
        events: list[bytes] = []
        # Only the bytes not searched before are searched (a huge event costs linear time);
        # the complete events are then split at once.
        last = self._buffer.rfind(b"\n\n", max(0, self._scanned - 1))
        if last >= 0:
            events = bytes(self._buffer[:last]).split(b"\n\n")
            del self._buffer[: last + 2]
        self._scanned = len(self._buffer)
        if len(self._buffer) > self.max_event_bytes:
            raise EventTooLarge(self.max_event_bytes)
        return events

    def rest(self) -> bytes:
        """What is left at the end of the stream (an event without its blank line)."""
        rest = bytes(self._buffer) + self._carry.replace(b"\r", b"")
        self._buffer.clear()
        self._scanned = 0
        self._carry = b""
        return rest
