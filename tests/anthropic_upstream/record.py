"""What the fake recorded: ``Seen`` (one request) and the read-back views tests assert on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.anthropic_upstream import protocol
from tests.anthropic_upstream.agent import Conversation
from tests.anthropic_upstream.protocol import Emitted


@dataclass(repr=False)
class Seen:
    """One ``POST /v1/messages`` as the fake received it, and what it did with it."""

    index: int  # 0-based, over the server's life
    conversation: str  # the run key
    path: str  # with the query string (Claude Code: /v1/messages?beta=true)
    tokens: int  # input tokens in the fake's count (the whole prompt)
    max_tokens: int
    budget: int  # tokens + max_tokens, what the window is checked against
    stream: bool
    thinking: bool
    kind: str  # step, final, read, summary, stray, failed, rejected (window), invalid (400), unauthorized
    step: int
    offered_read: bool
    read_follow_up: bool
    handles: list[str]
    problems: list[str]  # structure problems the real API refuses
    thinking_problems: list[str]  # thinking blocks not sent back as emitted
    leaks: list[str]  # read_tool_output in a request that is not a read follow-up round
    merged: list[str]  # consecutive same-role messages (merged by the API, not an error)
    cache_breakpoints: list[str]  # where cache_control sits: tools[23], system[2], messages[5].content[0]
    tool_names: list[str]
    body: dict[str, Any]
    headers: dict[str, str]
    status: int = 200
    at: float = 0.0  # time.monotonic() when it arrived
    error: str = ""  # the error message answered, if any
    cache_read: int = 0
    cache_creation: int = 0
    content: list[dict[str, Any]] = field(default_factory=list)  # the answer's content blocks

    @property
    def input_tokens(self) -> int:
        """``usage.input_tokens`` as answered: the prompt less what the cache read or wrote."""
        return self.tokens - self.cache_read - self.cache_creation

    def __repr__(self) -> str:
        return (
            f"<request {self.index} {self.kind} step={self.step} tokens={self.tokens} budget={self.budget} "
            f"stream={self.stream} follow_up={self.read_follow_up} problems={len(self.problems)}>"
        )


class Recorder:
    """The requests a fake received and views of them (a base of ``AnthropicUpstream``)."""

    requests: list[Seen]
    conversations: dict[str, Conversation]
    emitted: dict[str, Emitted]

    def _all(self, attribute: str) -> list[str]:
        return [f"request {s.index}: {p}" for s in self.requests for p in getattr(s, attribute)]

    @property
    def problems(self) -> list[str]:
        return self._all("problems")

    @property
    def thinking_problems(self) -> list[str]:
        return self._all("thinking_problems")

    @property
    def leaks(self) -> list[str]:
        return self._all("leaks")

    @property
    def merged(self) -> list[str]:
        return self._all("merged")

    @property
    def rejected(self) -> list[Seen]:
        return [s for s in self.requests if s.kind == "rejected"]

    @property
    def reads(self) -> list[Seen]:
        return [s for s in self.requests if s.kind == "read"]

    @property
    def follow_ups(self) -> list[Seen]:
        return [s for s in self.requests if s.read_follow_up]

    @property
    def max_tokens_seen(self) -> int:
        """The largest budget (prompt + max_tokens) of any request received."""
        return max((s.budget for s in self.requests), default=0)

    @property
    def thinking_echoed(self) -> int:
        """Thinking blocks the fake emitted and saw again (each checked byte for byte)."""
        seen = {
            b.get("signature") or b.get("data")
            for s in self.requests
            for m in s.body.get("messages") or []
            for b in protocol.blocks(m)
            if isinstance(b, dict) and b.get("type") in protocol.THINKING_KINDS
        }
        return len(seen & set(self.emitted))

    def conversation(self) -> Conversation:
        """The only conversation (tests run one agent run per server)."""
        assert len(self.conversations) == 1, f"expected one conversation, saw {list(self.conversations)}"
        return next(iter(self.conversations.values()))

    def summary(self) -> str:
        """One line per request, for assertion messages."""
        return "\n".join(
            f"#{s.index} {s.kind} status={s.status} step={s.step} tokens={s.tokens} budget={s.budget} "
            f"cache_read={s.cache_read} cache_creation={s.cache_creation} stream={s.stream} "
            f"messages={len(s.body.get('messages') or [])} handles={len(s.handles)} "
            f"read_offered={s.offered_read} follow_up={s.read_follow_up} problems={len(s.problems)} "
            f"thinking={len(s.thinking_problems)} leaks={len(s.leaks)}"
            + (f" error={s.error[:80]!r}" if s.error else "")
            for s in self.requests
        )
