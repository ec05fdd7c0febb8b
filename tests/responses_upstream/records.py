"""What the fake Responses model remembers: each run's progress and each request it received,
with the views tests read back to judge a run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.responses_upstream.protocol import input_items


@dataclass
class Conversation:
    key: str
    step: int = 0  # steps issued to the client (calls of its own tool)
    finished: bool = False
    reads: int = 0
    last_read_step: int = 0
    answers: int = 0  # answers given (ids of items are derived from it)


@dataclass(repr=False)
class Seen:
    """One ``/v1/responses`` request as the fake received it, and what it did with it."""

    index: int
    conversation: str
    tokens: int  # input tokens, in the project's count
    budget: int  # tokens + max_output_tokens
    stream: bool
    kind: str  # rejected, step, final, read, failed, stray, summary, invalid, unknown_item
    step: int
    offered_read: bool
    read_follow_up: bool
    handles: list[str]
    problems: list[str]  # protocol problems of the input
    reasoning_problems: list[str]  # reasoning items that came back altered or unknown
    leaks: list[str]  # read_tool_output items in a request that came from the client's history
    follower_changes: list[str]  # reasoning items followed by another item than when emitted
    request_kind: str  # Codex's x-codex-turn-metadata request_kind (turn, compaction), else ""
    body: dict[str, Any]
    headers: dict[str, str]
    output: list[dict[str, Any]] = field(default_factory=list)  # the answer's output items

    def __repr__(self) -> str:
        return (
            f"<request {self.index} {self.kind} step={self.step} tokens={self.tokens} budget={self.budget} "
            f"stream={self.stream} follow_up={self.read_follow_up} problems={len(self.problems)}>"
        )


class RequestRecords:
    """What tests read back from the model's records (kept apart from the model's decisions so
    each stays short)."""

    requests: list[Seen]
    conversations: dict[str, Conversation]
    encrypted: dict[str, str]  # reasoning id -> the encrypted_content emitted

    @property
    def rejected(self) -> list[Seen]:
        return [s for s in self.requests if s.kind == "rejected"]

    @property
    def max_tokens_seen(self) -> int:
        return max((s.budget for s in self.requests), default=0)

    @property
    def problems(self) -> list[str]:
        return [f"request {s.index}: {p}" for s in self.requests for p in s.problems]

    @property
    def reasoning_problems(self) -> list[str]:
        return [f"request {s.index}: {p}" for s in self.requests for p in s.reasoning_problems]

    @property
    def leaks(self) -> list[str]:
        return [f"request {s.index}: {p}" for s in self.requests for p in s.leaks]

    @property
    def follower_changes(self) -> list[str]:
        return [f"request {s.index}: {p}" for s in self.requests for p in s.follower_changes]

    @property
    def reads(self) -> list[Seen]:
        return [s for s in self.requests if s.kind == "read"]

    @property
    def follow_ups(self) -> list[Seen]:
        return [s for s in self.requests if s.read_follow_up]

    @property
    def reasoning_echoed(self) -> int:
        """Reasoning items the server emitted and saw again (checked byte for byte)."""
        seen: set[str] = set()
        for request in self.requests:
            for item in input_items(request.body):
                if (
                    isinstance(item, dict)
                    and item.get("type") == "reasoning"
                    and item.get("id") in self.encrypted
                ):
                    seen.add(str(item["id"]))
        return len(seen)

    def conversation(self) -> Conversation:
        """The only conversation (tests run one agent run per server)."""
        assert len(self.conversations) == 1, f"expected one conversation, saw {list(self.conversations)}"
        return next(iter(self.conversations.values()))

    def summary(self) -> str:
        """One line per request, for assertion messages."""
        return "\n".join(
            f"#{s.index} {s.kind} step={s.step} tokens={s.tokens} budget={s.budget} stream={s.stream} "
            f"items={len(input_items(s.body))} handles={len(s.handles)} read_offered={s.offered_read} "
            f"follow_up={s.read_follow_up} "
            f"problems={len(s.problems)} reasoning={len(s.reasoning_problems)} leaks={len(s.leaks)}"
            + (f" request_kind={s.request_kind}" if s.request_kind else "")
            for s in self.requests
        )
