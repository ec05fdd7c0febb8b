"""What a policy did to one request, as typed records: one per stage that has something to say.

Stages record facts here, never in a free-form dictionary, so what an event, a metric or a test
reads is checked by the type checker and named the same everywhere. ``StageFacts.to_event()``
is the ``details`` object of a compaction event (fields left unset are omitted).
"""

from __future__ import annotations

from typing import Any

import msgspec


class _Fact(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    pass


class TriggerFact(_Fact, frozen=True):
    tokens: int
    threshold: int
    window: int
    # The whole request (view, answer reserve, the read tool when handles are named) compared
    # with the threshold, and the read room kept free under the window.
    request_tokens: int = 0
    read_room: int = 0
    # Why a request over the threshold did (or did not) compact in a thrashing session.
    limited: str | None = None
    # The session came back after its prompt cache expired (the trigger's ``cold_high``).
    cold: bool = False


class SummaryFact(_Fact, frozen=True):
    """A summary made at this request."""

    model: str
    prompt_family: str
    prompt_version: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    fallback_reason: str | None = None
    covered: tuple[int, int] = (0, 0)  # the client's messages it covers
    covered_digest: str = ""
    # A summary prepared ahead: used, none_ready, stale or rejected: <why> (None: not prepared).
    prepared: str | None = None


class SummarizeFact(_Fact, frozen=True):
    skipped: str | None = None
    retained_tail: float | None = None
    step_aware: bool | None = None
    # The whole request after the compaction, and why it is above the low-water target when
    # it is (what the view keeps whatever happens is larger than the target).
    request_tokens: int = 0
    target_tokens: int = 0
    target_missed: str | None = None
    # The parts that alone leave less than the read room free under the window; ``first`` for
    # the first such point of the session (what the proxy logs and counts, once per session).
    no_read_room: str | None = None
    no_read_room_first: bool = False


class AutoCompactFact(_Fact, frozen=True):
    skipped: str | None = None
    trigger: float | None = None
    window: int | None = None


class OffloadFact(_Fact, frozen=True):
    outputs: int
    handles: tuple[str, ...]
    # Edits whose large bodies (a file's text, a patch) were offloaded from their calls.
    edits: int = 0


class SupersededFact(_Fact, frozen=True):
    """Outputs a later step made obsolete, replaced by a note naming their handles."""

    reads: int
    commands: int
    handles: tuple[str, ...]
    # Where the notes went: "tail" (the previous request's tail, as the cache allows), "point"
    # (a compaction point), "cold" (the cache had expired), "paid" (a warm prefix rewritten
    # because the tokens saved on the requests ahead pay for the cache it loses).
    rewrite: str = "tail"


class RetryCollapseFact(_Fact, frozen=True):
    chains: int
    dropped_messages: int


class SafeguardFact(_Fact, frozen=True):
    dropped_messages: int
    summarized_messages: int
    cut_messages: int
    over_budget: bool


class MicroCompactFact(_Fact, frozen=True):
    cleared: int


class NLatestFact(_Fact, frozen=True):
    n: int
    retained_history_messages: int


class LargeRequestFact(_Fact, frozen=True):
    worker_process: bool


class StageFacts(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Every fact of one request. Mutable while the stages run; copied into the outcome."""

    trigger: TriggerFact | None = None
    summary: SummaryFact | None = None
    summarize: SummarizeFact | None = None
    auto_compact: AutoCompactFact | None = None
    offload: OffloadFact | None = None
    # Between points of a tight session: outputs no longer the newest, behind their handles.
    tail_offload: OffloadFact | None = None
    retry_collapse: RetryCollapseFact | None = None
    # Reads of a file read again (or edited) later, and commands run again, behind their handles.
    superseded_reads: SupersededFact | None = None
    token_safeguard: SafeguardFact | None = None
    micro_compact: MicroCompactFact | None = None
    n_latest: NLatestFact | None = None
    # The client's history no longer held what the session's summary covered.
    checkpoint_dropped: str | None = None
    # The view came out larger than the request: the request went as it came.
    reverted: str | None = None
    large_request: LargeRequestFact | None = None

    def copy(self) -> StageFacts:
        return msgspec.structs.replace(self)

    def to_event(self) -> dict[str, Any]:
        """The facts as JSON-ready data (unset ones left out)."""
        data: dict[str, Any] = msgspec.to_builtins(self)
        return data
