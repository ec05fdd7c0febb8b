"""A door: a route whose requests the proxy compacts, and what a request's path says besides its
body.

Most doors are one fixed path whose body says everything (``model``, ``stream``). A Gemini door
names the model in its path (``/v1beta/models/{model}:generateContent``) and asks for a stream
by the path (``:streamGenerateContent``, with ``alt=sse``): a door's path may hold ``{model}``,
and its row says whether its requests stream. What a request's path says is its ``Target``,
which the dialect adapter is bound to (``Dialect.at``) for that request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote

MODEL = b"{model}"


@dataclass(frozen=True, slots=True)
class Target:
    """What a request's path says that its body does not: the model it names and whether it asks
    for a stream (``None``: the body says, as on every door but Gemini's)."""

    model: str | None = None
    stream: bool | None = None


BODY_SAYS = Target()


@dataclass(frozen=True, slots=True)
class Door:
    """A route whose requests are compacted: the dialect that reads them and the provider
    (``upstream/providers.py``) they go to."""

    method: bytes
    path: bytes  # may hold ``{model}``: one path segment (or its end), the model the request names
    dialect: str
    provider: str
    title: str  # the API's name, for the documentation page
    # Whether the path asks for a stream (None: the body's ``stream`` says).
    stream: bool | None = None
    # A query parameter the request must carry to be compacted (``alt=sse``: a Gemini stream
    # as events; without it the answer is a JSON array, relayed as it comes).
    query: tuple[bytes, bytes] | None = None

    def target(self, raw_path: bytes, query_string: bytes) -> Target | None:
        """What the request's path says, or None when it is not this door's request."""
        if self.query is not None and self.query not in _pairs(query_string):
            return None
        if MODEL not in self.path:
            return Target(stream=self.stream) if raw_path == self.path else None
        before, _, after = self.path.partition(MODEL)
        if not (raw_path.startswith(before) and raw_path.endswith(after)):
            return None
        name = raw_path[len(before) : len(raw_path) - len(after)]
        if not name or b"/" in name or b":" in name or len(raw_path) < len(before) + len(after):
            return None
        return Target(model=unquote(name.decode("ascii", "replace")), stream=self.stream)


def _pairs(query_string: bytes) -> list[tuple[bytes, bytes]]:
    return [(k.encode(), v.encode()) for k, v in parse_qsl(query_string.decode("latin-1"))]


class DoorTable:
    """The doors, found by method and path: fixed paths by one lookup, the others by pattern."""

    def __init__(self, doors: Sequence[Door]) -> None:
        self.fixed = {(d.method, d.path): d for d in doors if MODEL not in d.path and d.query is None}
        self.patterns = [d for d in doors if MODEL in d.path or d.query is not None]

    def find(self, method: bytes, raw_path: bytes, query_string: bytes) -> tuple[Door, Target] | None:
        door = self.fixed.get((method, raw_path))
        if door is not None:
            return door, BODY_SAYS if door.stream is None else Target(stream=door.stream)
        for door in self.patterns:
            if door.method == method:
                target = door.target(raw_path, query_string)
                if target is not None:
                    return door, target
        return None
