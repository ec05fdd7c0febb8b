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

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from policies.conversation import Message
from policies.tokens import TokenCounter
from proxy.dialects.doors import Target
from proxy.dialects.responses_compaction import RemoteCompaction
from proxy.dialects.usage_fields import add_round_usage, int_field, int_path, json_usage
from proxy.wire.errors import ProxyError
from proxy.wire.response_writer import ResponseWriter

Headers = list[tuple[bytes, bytes]]

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
    remote_compaction: RemoteCompaction | None  # its requests may ask the proxy to compact

    def at(self, target: Target) -> Dialect:
        """This adapter for a request whose path says ``target`` (a Gemini door's model and
        stream; every other door's body says both, and its adapter is itself)."""
        ...

    def streams(self, body: dict[str, Any]) -> bool:
        """Whether the answer to a body this adapter wrote is an event stream."""
        ...

    def model_of(self, body: dict[str, Any]) -> Any:
        """The model a body this adapter wrote is for."""
        ...

    def json_url(self, url: str) -> str:
        """The URL asking for the same answer as one JSON body (a shadow comparison's)."""
        ...

    @property
    def tool_call_marker(self) -> bytes:
        """Bytes only an answer that calls a tool contains."""
        ...

    @property
    def cached_input_ratio(self) -> float: ...

    @property
    def cache_write_ratio(self) -> float: ...

    def billed(self, usages: Iterable[Any]) -> Usage:
        """An answer's usage objects as the provider billed them (prompt, cached, written, output)."""
        ...

    @property
    def history_field(self) -> str:
        """The body's list of messages or items the conversation grows."""
        ...

    def parse(self, body: Any, known: int = 0) -> Parsed:
        """Read a request; a structural error is a ``ProxyError`` (400) naming the field.
        ``known``: how many leading items of the history are the conversation's last
        request's, read (and checked) then."""
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

    def upstream_headers(self, headers: Headers, body: dict[str, Any] | None) -> Headers:
        """The headers a body the proxy wrote needs upstream (``body`` None: the client's own
        bytes go, with the client's headers)."""
        ...

    async def restore(self, tenant: str, data: Any) -> tuple[Any, int]:
        """A request as the upstream must see it before it is read (e.g. read rounds the
        client never saw put back where they happened), and how many were restored."""
        ...

    def restores(self) -> bool:
        """Whether ``restore`` could change a body now (a worker process that reads a large
        body asks the parent, which holds the state, only then)."""
        ...

    def restore_wanted(self, data: Any) -> list[Any]:
        """What ``restore`` would look up for ``data`` (pure: it runs where the body is read)."""
        ...

    async def restore_found(self, tenant: str, wanted: list[Any]) -> Any:
        """What was found for ``wanted`` (in the process that holds the state)."""
        ...

    def restore_splice(self, data: Any, found: Any) -> tuple[Any, int]:
        """``data`` with ``found`` put back, and how many were (pure)."""
        ...

    def read_loop_start(self, body: dict[str, Any]) -> Any:
        """What the dialect remembers of a read loop's first body for ``read_loop_end``."""
        ...

    async def read_loop_end(self, tenant: str, mark: Any, body: dict[str, Any], result: Any) -> None:
        """A read loop answered: ``body`` is its last round's, ``result`` its ``LoopResult``."""
        ...

    def client_request(self, model: str, messages: Sequence[Message], tools: Sequence[Any]) -> dict[str, Any]:
        """The request a client of this format sends for a neutral history (the replay's)."""
        ...

    def answer_from_chat(
        self, message: Message, model: Any, answer_id: str, usage: dict[str, Any] | None
    ) -> dict[str, Any]:
        """A Chat Completions answer's message as this format's answer (the replay's upstream)."""
        ...

    def cache_marks(self, parsed: Parsed) -> list[int]:
        """The blocks (0: the tools, 1 + i: neutral message i) that carry a prompt-cache
        breakpoint the client placed (for the replay's cost model; none by default)."""
        ...


class BaseDialect:
    """What an adapter inherits unless its format differs: the usage keys of one answer, the
    answer length a body asks for, counting through ``parse``, and hooks that do nothing.

    An adapter writes ``parse``, ``render``, the read tool's four methods, ``json_answer``,
    ``add_round``, ``final_json``, ``codec``, ``error_event`` and ``decision``."""

    name: str = ""
    # The usage fields of one answer: the prompt (the context the answer came from), the
    # output, and their sum; over read rounds the prompt is the last round's, outputs add up.
    prompt_key: ClassVar[str] = "prompt_tokens"
    output_key: ClassVar[str] = "completion_tokens"
    total_key: ClassVar[str] = "total_tokens"
    # The body field that asks for an answer length.
    max_tokens_key: ClassVar[str] = "max_tokens"
    # Where an answer's usage says how many prompt tokens were read from the prompt cache, and
    # bytes only an answer that calls a tool contains (the canary's figures).
    cached_path: ClassVar[tuple[str, ...]] = ("prompt_tokens_details", "cached_tokens")
    tool_call_marker: ClassVar[bytes] = b'"tool_calls"'
    # Without prices in the models table, the provider's usual price of a cached input token
    # and of a cache write, relative to a full-price input token.
    cached_input_ratio: ClassVar[float] = 0.5
    cache_write_ratio: ClassVar[float] = 1.0
    history_field: ClassVar[str] = "messages"
    remote_compaction: RemoteCompaction | None = None  # the Responses API's own (compact item)

    def parse(self, body: Any, known: int = 0) -> Parsed:
        raise NotImplementedError

    def at(self, target: Target) -> Dialect:
        return self  # type: ignore[return-value]

    def streams(self, body: dict[str, Any]) -> bool:
        return body.get("stream") is True

    def model_of(self, body: dict[str, Any]) -> Any:
        return body.get("model")

    def json_url(self, url: str) -> str:
        return url

    def answer_tokens(self, body: dict[str, Any]) -> int:
        return int_field(body, self.max_tokens_key)

    def count(self, body: dict[str, Any], counter: TokenCounter) -> int:
        return counter.count_request(self.parse(body).neutral).total

    def add_usage(self, total: dict[str, int], usage: Any) -> None:
        if isinstance(usage, dict):
            add_round_usage(total, usage, self.prompt_key, self.output_key, self.total_key)

    def prompt_tokens(self, usage: Any) -> int:
        return int_field(usage, self.prompt_key)

    def billed(self, usages: Iterable[Any]) -> Usage:
        """One answer's usage as billed; a stream's several usage objects merged field by field
        (the largest value)."""
        found = [u for u in usages if isinstance(u, dict)]
        return Usage(
            prompt=max((self.prompt_tokens(u) for u in found), default=0),
            cached=max((int_path(u, self.cached_path) for u in found), default=0),
            output=max((int_field(u, self.output_key) for u in found), default=0),
        )

    def reported_prompt_tokens(self, raw: bytes, sse: bool) -> int:
        if sse:
            return 0  # a stream reports usage in its last event, if at all
        return self.prompt_tokens(json_usage(raw))

    def upstream_headers(self, headers: Headers, body: dict[str, Any] | None) -> Headers:
        return headers

    async def restore(self, tenant: str, data: Any) -> tuple[Any, int]:
        if not self.restores():
            return data, 0
        wanted = self.restore_wanted(data)
        if not wanted:
            return data, 0
        return self.restore_splice(data, await self.restore_found(tenant, wanted))

    def restores(self) -> bool:
        return False

    def restore_wanted(self, data: Any) -> list[Any]:
        return []

    async def restore_found(self, tenant: str, wanted: list[Any]) -> Any:
        return None

    def restore_splice(self, data: Any, found: Any) -> tuple[Any, int]:
        return data, 0

    def read_loop_start(self, body: dict[str, Any]) -> Any:
        return None

    async def read_loop_end(self, tenant: str, mark: Any, body: dict[str, Any], result: Any) -> None:
        return None

    def cache_marks(self, parsed: Parsed) -> list[int]:
        return []


@dataclass(frozen=True, slots=True)
class Usage:
    """Prompt tokens as the provider billed them: ``prompt`` in all, ``cached`` read from the
    prompt cache, ``written`` into it (Anthropic), and the answer's ``output``."""

    prompt: int = 0
    cached: int = 0
    written: int = 0
    output: int = 0
