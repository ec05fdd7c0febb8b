"""What a policy's stages work on: the ``View`` of one request (the messages as they will be
sent and what was done to get them), the ``Context`` it is computed in (the counter, the
window, the summarizer and the other interfaces a stage may use), the session's
``Checkpoint`` carried from one request to the next, and an ``Offload`` (an output the view
names by handle). Stages import these from here; ``policies.pipeline`` builds and runs them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Protocol

from policies.conversation import Conversation, Message, parse
from policies.digests import Digests
from policies.facts import StageFacts
from policies.ledger import Ledger
from policies.pins import Pins
from policies.prompt_cache import PromptCache
from policies.summarizer import Summarizer
from policies.tokens import REPLY_PRIMING, TokenCounter


@dataclass(frozen=True, slots=True)
class Offload:
    """A tool output the view refers to by handle; the proxy stores it before sending."""

    handle: str
    content: str
    description: str


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What one session carries from a request to the next.

    ``summary`` replaces the client's messages ``[summary_at, summary_at + covered)``;
    ``covered_digest`` detects a client history that no longer holds what was summarized.
    ``placeholders`` maps "index:digest" of a client message to the exact message sent in its
    place; messages whose digest is in ``dropped`` are left out.
    """

    summary: Message | None = None
    summary_at: int = 0
    covered: int = 0
    # Client message indices inside the covered range kept verbatim right after the summary
    # (the last user message, pinned steps).
    pinned: tuple[int, ...] = ()
    covered_digest: str = ""
    placeholders: Mapping[str, Message] = field(default_factory=dict)
    dropped: frozenset[str] = frozenset()
    guidance: Message | None = None
    ledger: Ledger | None = None
    handles: tuple[str, ...] = ()
    compactions: int = 0
    requests: int = 0
    # Request numbers of recent compactions, to detect a session that keeps re-triggering.
    recent_compactions: tuple[int, ...] = ()
    # The last compaction point ended above its low-water target (the fixed part of the request
    # is too large): the next one waits until the read room is reached, instead of firing
    # again at the next high-water crossing (thrash).
    short_of_target: bool = False
    # At the last point, what stays at every point took the target by itself, the final step
    # left out: between points, outputs leave the view once they are not the newest.
    tight: bool = False
    # The session was told, once, that its fixed part leaves no read room (log line, metric).
    no_read_room_reported: bool = False
    # The request number at which the provider last had to write this session's prefix anew
    # (a compaction point, a session back after its cache expired, a rewrite that paid): the
    # trigger does not throw that write away on the next request unless the window requires.
    prefix_written_at: int = 0

    def with_requests(self, requests: int) -> Checkpoint:
        """This checkpoint with another request count: the change made on every request, so
        made by copying the fields (``dataclasses.replace`` inspects them on every call)."""
        copy = object.__new__(Checkpoint)
        for name in _CHECKPOINT_FIELDS:
            object.__setattr__(copy, name, getattr(self, name))
        object.__setattr__(copy, "requests", requests)
        return copy

    def same_but_requests(self, other: Checkpoint) -> bool:
        """Whether ``other`` holds the same state, whatever its request count."""
        for name in _CHECKPOINT_FIELDS:
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine is not theirs and name != "requests" and mine != theirs:
                return False
        return True


_CHECKPOINT_FIELDS = tuple(f.name for f in fields(Checkpoint))


@dataclass(slots=True)
class Context:
    """Everything a stage may consult besides the view itself."""

    counter: TokenCounter
    encoding: str
    window: int
    tools_tokens: int = 0
    summarizer: Summarizer | None = None
    model: str | None = None
    pins: Pins = field(default_factory=Pins)
    digests: Digests = field(default_factory=Digests)
    # Tokens the request asks to keep for the answer (``max_tokens``/``max_completion_tokens``).
    answer_tokens: int = 0
    # Tokens the proxy adds when a view names a saved output (the read tool's schema).
    injected_tokens: int = 0
    # The policy summarizes: the token safeguard folds steps into the summary, not drop them.
    summarizes: bool = False
    # Edits are artifacts (the offload stage's ``offload_arguments``): a summary saves every
    # edit it covers under a handle and its ledger lists them by file.
    edit_artifacts: bool = False
    # Transcripts (a summarizing stage's ``save_transcript``): every summary of the policy saves
    # the messages it replaces, verbatim, under one handle its ledger names.
    transcripts: bool = False
    # A dry run that prepares the next compaction point's summary ahead: the summarizing stage
    # summarizes what a point would at this size, even below its low-water target.
    preparing: bool = False
    # The rendered state ledger's largest size, as a share of the window: its lists are cut
    # (the complete ledger saved under a handle) rather than let it crowd out the view.
    ledger_share: float = 0.1
    # Tokens kept free under the window, beyond the answer's reserve, whenever a view names
    # saved outputs, so that the model's first read of a handle returns content.
    read_room: int = 0
    # Tokens kept for the answer (the token safeguard's ``reserve_tokens``); the request's own
    # ``answer_tokens`` count instead when larger.
    reserve_tokens: int = 1024
    # The provider's prompt cache of this session's prefix (``policies/prompt_cache.py``);
    # None: the stages are time-blind.
    cache: PromptCache | None = None


def requested_answer_tokens(body: Mapping[str, Any]) -> int:
    """The answer length a request asks for: a real server counts it against the window."""
    asked = [body.get(k) for k in ("max_completion_tokens", "max_tokens")]
    return max([0, *(v for v in asked if isinstance(v, int) and not isinstance(v, bool))])


@dataclass(slots=True)
class View:
    """The messages as they will be sent, and what was done to get them.

    ``origin[i]`` is the index in the client's messages of ``messages[i]``, or -1 for a
    message the policy inserted (a summary, a guidance note).
    """

    messages: list[Message]
    original: Sequence[Message]
    origin: list[int]
    checkpoint: Checkpoint
    mechanisms: list[str] = field(default_factory=list)
    facts: StageFacts = field(default_factory=StageFacts)
    offloads: dict[str, Offload] = field(default_factory=dict)
    changed: bool = False
    # Set by a trigger stage: this request is a compaction point, stages may make new decisions.
    compacting: bool = False
    trigger: str | None = None
    # A stage made a new decision at this compaction point (counted in the checkpoint).
    decided: bool = False
    # (messages list it was computed for, token count): stages ask often, lists change rarely.
    _tokens: tuple[list[Message], int] | None = None
    # (messages list, its parse) and the client's messages parsed: several stages of one
    # compaction point read the same list's steps, and the client's never change.
    _parsed: tuple[list[Message], Conversation] | None = None
    _parsed_original: Conversation | None = None

    def conversation(self) -> Conversation:
        """The view's messages as steps, parsed once per list (a stage that changes the view
        swaps in a new list; none changes one in place)."""
        if self._parsed is None or self._parsed[0] is not self.messages:
            self._parsed = (self.messages, parse(self.messages))
        return self._parsed[1]

    def original_conversation(self) -> Conversation:
        """The client's messages as steps, parsed once per request."""
        if self._parsed_original is None:
            self._parsed_original = parse(self.original)
        return self._parsed_original

    def tokens(self, ctx: Context) -> int:
        if self._tokens is not None and self._tokens[0] is self.messages:
            return self._tokens[1]
        total = (
            sum(ctx.counter.count_messages(self.messages, ctx.encoding)) + ctx.tools_tokens + REPLY_PRIMING
        )
        self._tokens = (self.messages, total)
        return total

    def note(self, mechanism: str) -> None:
        self.changed = True
        if mechanism not in self.mechanisms:
            self.mechanisms.append(mechanism)

    def remember_replacements(self, placeholders: Mapping[str, Message]) -> None:
        """Make replaced messages sticky (later requests of the session carry the same ones)
        and keep the handles of every output offloaded so far."""
        self.checkpoint = replace(
            self.checkpoint,
            placeholders=dict(placeholders),
            handles=tuple(dict.fromkeys((*self.checkpoint.handles, *self.offloads))),
        )

    def replace_messages(
        self, messages: list[Message], mechanism: str, origin: list[int] | None = None
    ) -> None:
        """Swap in a new message list. Without ``origin``, messages are matched back to the
        client's by identity (untouched messages are the same objects)."""
        if origin is None:
            position = {id(m): o for m, o in zip(self.messages, self.origin, strict=True)}
            origin = [position.get(id(m), -1) for m in messages]
        self.messages = messages
        self.origin = origin
        self.note(mechanism)


class Stage(Protocol):
    name: str

    async def apply(self, view: View, ctx: Context) -> View: ...
