"""What the fake Chat Completions model remembers: each conversation's progress and each
request it received, with the views tests read back to judge a run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Conversation:
    key: str
    step: int = 0  # steps issued to the client (its own tool calls or text actions)
    finished: bool = False
    reads: int = 0  # read_tool_output calls made
    last_read_step: int = 0  # the step count when the last read was made
    task: str | None = None  # the first user message of its first request


@dataclass(repr=False)
class Seen:
    """One chat request as the fake received it, and what it did with it."""

    index: int
    conversation: str
    tokens: int  # prompt tokens
    budget: int  # prompt tokens + max_tokens / max_completion_tokens
    stream: bool
    kind: str  # rejected, step, final, read, failed, stray, no_tools
    step: int
    offered_read: bool
    read_follow_up: bool
    handles: list[str]
    problems: list[str]
    task_kept: bool  # the first user message is the conversation's task, verbatim
    body: dict[str, Any]
    headers: dict[str, str]
    cached: int = 0  # prompt tokens reported as read from the prefix cache

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
    def task_not_kept(self) -> list[Seen]:
        """Requests whose first user message is not the conversation's task as first sent."""
        return [s for s in self.requests if not s.task_kept]

    @property
    def reads(self) -> list[Seen]:
        return [s for s in self.requests if s.kind == "read"]

    @property
    def follow_ups(self) -> list[Seen]:
        return [s for s in self.requests if s.read_follow_up]

    def conversation(self) -> Conversation:
        """The only conversation (tests run one agent run per server)."""
        assert len(self.conversations) == 1, f"expected one conversation, saw {list(self.conversations)}"
        return next(iter(self.conversations.values()))

    def summary(self) -> str:
        """One line per request, for assertion messages."""
        return "\n".join(
            f"#{s.index} {s.kind} step={s.step} tokens={s.tokens} budget={s.budget} stream={s.stream} "
            f"read_offered={s.offered_read} follow_up={s.read_follow_up} problems={len(s.problems)}"
            + ("" if s.task_kept else " TASK-NOT-VERBATIM")
            for s in self.requests
        )
