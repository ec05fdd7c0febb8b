"""What a dialect adapter does, and the shapes it hands to the rest of the proxy.

A dialect (Chat Completions, the Responses API, Anthropic Messages) knows one wire format:
how to read a request into the **neutral conversation** the policies work on (Chat
Completions messages: roles, ``tool_calls`` and ``tool`` results, see ``policies/README.md``)
and to write a view back as that format's request; how ``read_tool_output`` is declared,
recognized in an answer and answered; how its answers stream (a codec that relays text, holds
tool calls until they are known, and ends the stream well or with that format's error event);
and how its usage adds up over rounds. Nothing else in the proxy knows a wire format.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from policies.conversation import Message
from policies.tokens import TokenCounter
from proxy.errors import ProxyError
from proxy.response_writer import ResponseWriter

# The result an agent's call gets when it came in one answer with a read: it is not run, and
# the model calls it again (or not) with what it read.
NOT_RUN = (
    "Not run: this call was planned before the saved output was read. "
    "Call it again now if it is still needed."
)


# A round's first characters of text are held until the round shows it is not a read round
# (it ends, or writes more than this): short preambles of read rounds never reach the client,
# so a read round's text is dropped the same streamed and not (every door).
HELD_TEXT_CHARS = 400


@dataclass(slots=True)
class Parsed:
    """A request a dialect understood."""

    body: dict[str, Any]  # the wire body as parsed
    # The neutral request the policies take: {"model", "messages", "tools", "max_tokens"}.
    neutral: dict[str, Any]
    stream: bool
    # Why this request is not compacted (it still goes upstream, as the client sent it).
    skipped: str | None = None
    # Facts the dialect noticed, recorded in the compaction event (e.g. items kept as sent).
    notes: dict[str, Any] = field(default_factory=dict)
    # The dialect's own bookkeeping between reading and writing (e.g. which wire items each
    # neutral message came from).
    private: Any = None

    @property
    def model(self) -> Any:
        return self.body.get("model")


@dataclass(slots=True)
class Answer:
    """One upstream answer as the read loop needs it."""

    calls: list[Any]  # every tool call of the answer, in the dialect's own shape
    text: str | None = None
    usage: dict[str, Any] | None = None
    # Everything the answer produced, in the dialect's own shape (the Responses API appends a
    # round's reasoning items with its calls).
    items: list[Any] = field(default_factory=list)


class StreamCodec(Protocol):
    """One upstream round's event stream, as the client should see it."""

    @property
    def text(self) -> str:
        """The text the round wrote so far."""
        ...

    usage: dict[str, Any] | None
    complete: bool  # the answer finished (its final event arrived)
    error: Any  # the upstream ended the stream with its own error event

    async def take(self, event: bytes) -> None: ...
    async def take_all(self, events: list[bytes]) -> None:
        """The events of one upstream chunk, in order (a codec may relay runs of them at once)."""
        ...

    def calls(self) -> list[Any]: ...
    def items(self) -> list[Any]:
        """Everything the round produced, in the dialect's shape (``Answer.items``)."""
        ...

    async def finish(self, total_usage: dict[str, int]) -> None: ...


class Dialect(Protocol):
    name: str

    def parse(self, body: Any, lenient: bool) -> Parsed:
        """Read a request; a structural error is a ``ProxyError`` (400) naming the field."""
        ...

    def render(self, parsed: Parsed, view: Sequence[Message], origin: Sequence[int]) -> dict[str, Any]:
        """The wire body that sends ``view`` (untouched items exactly as they came)."""
        ...

    def answer_tokens(self, body: dict[str, Any]) -> int:
        """The answer length a wire body asks for (0: none): a server counts it in the window."""
        ...

    def count(self, body: dict[str, Any], counter: TokenCounter) -> int:
        """Prompt tokens of a wire body, in the proxy's count."""
        ...

    def with_read_tool(self, body: dict[str, Any], max_lines: int) -> dict[str, Any]: ...

    def without_read_tool(self, body: dict[str, Any]) -> dict[str, Any]: ...

    def is_read_call(self, call: Any) -> bool: ...

    def call_arguments(self, call: Any) -> Any: ...

    def json_answer(self, data: Any) -> Answer | None:
        """The answer of a non-streamed response, or None when it is not one (relayed as is)."""
        ...

    def add_round(
        self, body: dict[str, Any], answer: Answer, results: Sequence[tuple[Any, str]]
    ) -> dict[str, Any]:
        """``body`` with the model's read calls and their results appended."""
        ...

    def final_json(self, data: dict[str, Any], total_usage: dict[str, int]) -> bytes:
        """The last round's response for the client: internal calls removed, usage summed."""
        ...

    def codec(self, writer: ResponseWriter) -> StreamCodec: ...

    def error_event(self, error: ProxyError) -> bytes: ...

    def add_usage(self, total: dict[str, int], usage: Any) -> None: ...

    def prompt_tokens(self, usage: Any) -> int:
        """The prompt tokens an answer's usage reports (0: none), cached ones included."""
        ...

    def reported_prompt_tokens(self, raw: bytes, sse: bool) -> int:
        """The prompt tokens a relayed answer reports, from its first bytes (0: not found)."""
        ...

    def decision(self, raw: bytes, sse: bool) -> str:
        """The next decision of a raw answer (the first action's signature, or the final
        answer), for shadow comparisons."""
        ...
