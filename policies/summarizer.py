"""The summarizer interface, and the model-free summarizer built on the state ledger.

Summarizers that call a model live outside ``policies/`` (they need HTTP) and implement the
same ``Summarizer`` protocol; a policy only ever sees this interface.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from policies.conversation import Message
from policies.ledger import Ledger


@dataclass(frozen=True, slots=True)
class SummaryRequest:
    """Summarize ``previous_summary`` (the last cycle's, if any) plus ``messages``, the
    history newly covered by this compaction."""

    previous_summary: str | None
    messages: Sequence[Message]
    ledger: Ledger
    prompt_family: str = "hybrid_v2"
    # The client's messages the new summary covers (start, end), and the digest of each: what
    # a summary prepared ahead is checked against (it covers a prefix of this range, unedited).
    covered: tuple[int, int] = (0, 0)
    covered_digests: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SummaryResult:
    text: str
    model: str
    prompt_family: str
    prompt_version: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    fallback_reason: str | None = None
    # A summary prepared ahead: used, none_ready, stale or rejected: <why> (None: not prepared).
    prepared: str | None = None


class Summarizer(Protocol):
    async def summarize(self, request: SummaryRequest) -> SummaryResult: ...


class LedgerSummarizer:
    """Model-free: the summary is the narrative-free ledger itself (it is appended anyway)."""

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        return SummaryResult(text="", model="ledger", prompt_family="ledger", prompt_version="1")
