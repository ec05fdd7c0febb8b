"""Making a new summary at a compaction point, shared by the summarizing stages.

A new summary covers the previous summary plus the history newly covered, so a session is
summarized in cycles; the state ledger is merged across cycles, so exact items survive any
number of them (the user's words verbatim; when edits are artifacts, every covered edit, its
content saved under the handle the ledger names; with transcripts, the messages each summary
replaced, saved verbatim under one handle per compaction, every one listed in order). The
checkpoint records the covered range of the client's messages and its digest, which
``apply_checkpoint`` verifies before reusing the summary on later requests.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass, replace

from policies.conversation import FIXED_ROLES, Conversation, Message, message_text, role
from policies.facts import SummaryFact
from policies.handles import mention, new_handle
from policies.ledger import LEDGER_HEADING, Ledger
from policies.ledger_extraction import build_ledger
from policies.ledger_records import superseded_records
from policies.stages.common import SUMMARY_HEADER, summary_content
from policies.summarizer import LedgerSummarizer, SummaryRequest, SummaryResult
from policies.transcript import build_transcript
from policies.view import Checkpoint, Context, Offload, View

# A session that compacted THRASH_LIMIT times within THRASH_REQUESTS requests is limited:
# it keeps its current view (the token safeguard still applies) instead of summarizing again.
THRASH_LIMIT = 3
THRASH_REQUESTS = 6


def summary_index(view: View) -> int | None:
    summary = view.checkpoint.summary
    if summary is None:
        return None
    return next((i for i, m in enumerate(view.messages) if m is summary), None)


def view_index_of(view: View, original_index: int) -> int:
    """The first view position holding a client message at or after ``original_index``."""
    return next((i for i, o in enumerate(view.origin) if o >= original_index), len(view.messages))


def over_window_at(ctx: Context) -> int:
    """Tokens above which a view no longer fits the window with room for the answer (the
    token safeguard's default reserve, or what the request asks for)."""
    return ctx.window - max(1024, ctx.answer_tokens)


def is_thrashing(checkpoint: Checkpoint) -> bool:
    recent = [r for r in checkpoint.recent_compactions if checkpoint.requests - r < THRASH_REQUESTS]
    return len(recent) >= THRASH_LIMIT


def render_ledger(ledger: Ledger, ctx: Context) -> tuple[str, dict[str, tuple[str, str]]]:
    """The ledger as the summary shows it, held to ``ctx.ledger_share`` of the window whatever
    the agent's shape, and what that rendering names by handle: when a list had to be cut, the
    complete ledger (every item, every user message verbatim) is saved and named."""
    budget = max(200, int(ctx.ledger_share * ctx.window))
    text, limits, complete = ledger.render_within(lambda t: ctx.counter.count_text(t, ctx.encoding) <= budget)
    if complete is None:
        return text, {}
    saved = {h: (t, "user message") for h, t in ledger.saved_texts(limits).items()}
    full = "\n".join([complete, *(f"\n[{mention(h)}]\n{t}" for h, (t, _) in saved.items())])
    handle = new_handle(full)
    saved[handle] = (full, "the complete state ledger")
    note = f"(Lists cut to fit; the complete ledger, every item and user message: {mention(handle)})"
    return f"{text}\n{note}", saved


def narrative(summary: str) -> str:
    """The model-written part of a summary message (between its header and its ledger)."""
    body = summary.removeprefix(SUMMARY_HEADER)
    end = body.find(LEDGER_HEADING)
    return (body[:end] if end >= 0 else "").strip()


def _add_offloads(view: View, previous: Checkpoint, saved: dict[str, tuple[str, str]]) -> None:
    for handle, (content, description) in saved.items():
        if handle not in view.offloads and handle not in previous.handles:
            view.offloads[handle] = Offload(handle=handle, content=content, description=description)


def _save_transcript(view: View, ledger: Ledger, replaced: list[tuple[Message, int]]) -> Ledger:
    """The messages this summary replaces, as the view had them, saved verbatim under one
    handle; the ledger that lists it."""
    earlier = ledger.transcripts[-1].handle if ledger.transcripts else None
    transcript = build_transcript(
        [m for m, _ in replaced], [o for _, o in replaced], earlier, older=ledger.transcripts
    )
    if transcript is None:
        return ledger
    view.offloads[transcript.handle] = Offload(transcript.handle, transcript.text, transcript.description())
    return ledger.with_transcript(transcript.record)


async def _summarize(ctx: Context, request: SummaryRequest) -> SummaryResult:
    """The summarizer's answer, or an empty ledger-only result when it fails."""
    summarizer = ctx.summarizer or LedgerSummarizer()
    started = time.perf_counter()
    try:
        return await summarizer.summarize(request)
    except Exception as exc:
        return SummaryResult(
            text="",
            model="ledger",
            prompt_family="ledger",
            seconds=time.perf_counter() - started,
            # Only messages a summarizer marks as public are recorded: others could quote content.
            fallback_reason=str(exc) if getattr(exc, "public", False) else f"{type(exc).__name__}",
        )


@dataclass(frozen=True)
class _Span:
    """Where a new summary goes and what it covers.

    The summary message takes view index ``at``; the view's messages from ``new_from`` up to the
    cut are the ones it newly replaces. In the client's messages it covers ``start`` to ``end``,
    the previous summary having covered ``start`` to ``old_end`` (``old_end == start`` when
    there is none)."""

    at: int
    new_from: int
    start: int
    old_end: int
    end: int


def _span(view: View, anchor: int, cut: int) -> _Span:
    """A new summary takes the current summary's place and extends its coverage; without one it
    starts at client message ``anchor``. It covers up to view index ``cut``."""
    previous = view.checkpoint
    end = view.origin[cut] if cut < len(view.messages) else len(view.original)
    current = summary_index(view)
    if current is not None:
        old_end = previous.summary_at + previous.covered
        return _Span(at=current, new_from=current + 1, start=previous.summary_at, old_end=old_end, end=end)
    at = view_index_of(view, anchor)
    return _Span(at=at, new_from=at, start=anchor, old_end=anchor, end=end)


def _covered_ledger(
    view: View, ctx: Context, span: _Span, keep: list[int], *, goal: str | None, task_kept: bool
) -> Ledger:
    """The state ledger of everything the new summary covers: the previous ledger merged with
    the newly covered messages' one, the kept steps' user words marked kept. What it names by
    handle (user messages; each covered edit's content when edits are artifacts) is offloaded."""
    previous = view.checkpoint
    artifacts: dict[str, tuple[str, str]] | None = {} if ctx.edit_artifacts else None
    ledger = build_ledger(
        view.original,
        span.old_end,
        span.end,
        goal=goal,
        task_kept=task_kept,
        kept=keep,
        artifacts=artifacts,
    )
    if previous.ledger is not None:
        ledger = previous.ledger.merge(ledger)
    ledger = ledger.with_kept({message_text(view.original[i]) for i in keep})
    saved = {**(artifacts or {}), **{h: (t, "user message") for h, t in ledger.saved_texts().items()}}
    _add_offloads(view, previous, saved)
    return ledger


def _replaced(view: View, span: _Span, cut: int, keep: list[int]) -> list[tuple[Message, int]]:
    """The view's messages (with their client index) the new summary replaces: the newly
    covered ones except the kept steps."""
    return [
        (m, o)
        for m, o in zip(view.messages[span.new_from : cut], view.origin[span.new_from : cut], strict=True)
        if o not in keep
    ]


async def _write_summary(
    ctx: Context,
    previous_text: str | None,
    replaced: list[tuple[Message, int]],
    ledger: Ledger,
    family: str,
    covered: tuple[int, int, tuple[str, ...]] = (0, 0, ()),
) -> SummaryResult:
    """The summary of the previous one plus the replaced messages. A ledger-only summary (the
    safeguard's fold, a failed model call) keeps the narrative an earlier model summary wrote:
    the ledger is rebuilt, the story is not lost."""
    request = SummaryRequest(
        previous_summary=previous_text,
        messages=[m for m, _ in replaced],
        ledger=ledger,
        prompt_family=family,
        covered=covered[:2],
        covered_digests=covered[2],
    )
    result = await _summarize(ctx, request)
    if not result.text.strip() and previous_text is not None:
        result = replace(result, text=narrative(previous_text))
    return result


def _checkpoint_after(
    view: View,
    ctx: Context,
    span: _Span,
    keep: list[int],
    summary: Message,
    ledger: Ledger,
    handles: list[str],
) -> Checkpoint:
    """The checkpoint recording the new summary: the client's range it covers and that range's
    digest, the kept steps, the merged ledger and every handle named so far. Placeholders and
    drops of messages the summary now covers are forgotten."""
    previous = view.checkpoint
    covered = view.original[span.start : span.end]
    gone = (
        {ctx.digests.at(span.start + i, m) for i, m in enumerate(covered)}
        if (previous.placeholders or previous.dropped)
        else set()
    )
    return replace(
        previous,
        summary=summary,
        summary_at=span.start,
        covered=span.end - span.start,
        pinned=tuple(keep),
        covered_digest=ctx.digests.range(covered),
        placeholders={d: m for d, m in previous.placeholders.items() if d not in gone},
        dropped=frozenset(d for d in previous.dropped if d not in gone),
        ledger=ledger,
        handles=tuple(dict.fromkeys(handles)),
    )


def kept_after_summary(
    conversation: Conversation, start: int, end: int, pinned: Collection[int]
) -> list[int]:
    """Client indices a summary over ``conversation.messages[start:end]`` keeps verbatim right after it: the
    pinned ones in the range (whole steps; the caller pins the current last user message), and,
    once an instruction is among them (a user turn, a system or developer message from inside
    the history), every later user turn of the range.

    The view keeps the conversation's order: what stays after the summary reads as newer than
    what the summary holds, so a kept instruction never leaves a later user turn (a correction
    of it) in the ledger only; the user's words are never lost either way (the ledger lists
    every one in order, a kept one named in its place). An earlier last user message kept by a
    previous summary and no longer pinned goes into this one's ledger."""
    keep = set(pinned) & set(range(start, end))
    if not keep:
        return []
    turns = {s.start for s in conversation.steps if s.kind == "user" and start <= s.start < end}
    messages = conversation.messages
    first = min((i for i in keep if i in turns or role(messages[i]) in FIXED_ROLES), default=end)
    return sorted(keep | {i for i in turns if i > first})


async def compact_range(
    view: View,
    ctx: Context,
    *,
    anchor: int,
    cut: int,
    family: str,
    mechanism: str,
    goal: str | None,
    pinned: set[int] | None = None,
    task_kept: bool = False,
) -> None:
    """Replace the view's messages from the current summary (or from ``anchor``, an index
    of the client's messages, when there is none) up to view index ``cut`` by a new summary.

    ``pinned`` are client message indices (whole steps) that stay verbatim right after the
    summary even though they fall in the covered range."""
    previous = view.checkpoint
    span = _span(view, anchor, cut)
    keep = kept_after_summary(view.original_conversation(), span.start, span.end, pinned or set())
    ledger = _covered_ledger(view, ctx, span, keep, goal=goal, task_kept=task_kept)
    replaced = _replaced(view, span, cut, keep)
    # The ledger says which outputs the view had replaced as superseded (their notes say it).
    ledger = ledger.with_superseded(superseded_records(m for m, _ in replaced))
    if ctx.transcripts:
        ledger = _save_transcript(view, ledger, replaced)
    handles = [*previous.handles, *view.offloads]
    ledger = ledger.with_handles(handles)
    previous_text = previous.summary.get("content") if previous.summary else None
    previous_text = previous_text if isinstance(previous_text, str) else None
    digests = tuple(ctx.digests.at(i, view.original[i]) for i in range(span.start, span.end))
    result = await _write_summary(
        ctx, previous_text, replaced, ledger, family, (span.start, span.end, digests)
    )
    ledger_text, ledger_saved = render_ledger(ledger, ctx)
    _add_offloads(view, previous, ledger_saved)
    handles = [*handles, *ledger_saved]
    message: Message = {"role": "user", "content": summary_content(result.text, ledger_text)}
    view.replace_messages(
        [*view.messages[: span.at], message, *(view.original[i] for i in keep), *view.messages[cut:]],
        mechanism,
        origin=[*view.origin[: span.at], -1, *keep, *view.origin[cut:]],
    )
    view.checkpoint = _checkpoint_after(view, ctx, span, keep, message, ledger, handles)
    view.decided = True
    view.facts.summary = _summary_fact(result, (span.start, span.end), view.checkpoint.covered_digest)


def _summary_fact(result: SummaryResult, covered: tuple[int, int], digest: str) -> SummaryFact:
    return SummaryFact(
        model=result.model,
        prompt_family=result.prompt_family,
        prompt_version=result.prompt_version,
        input_tokens=result.input_tokens,
        output_tokens=result.output_tokens,
        seconds=round(result.seconds, 4),
        fallback_reason=result.fallback_reason,
        prepared=result.prepared,
        covered=covered,
        covered_digest=digest,
    )
