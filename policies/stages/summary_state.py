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
from dataclasses import replace

from policies.conversation import Message, message_text
from policies.facts import SummaryFact
from policies.handles import mention, new_handle
from policies.ledger import LEDGER_HEADING, Ledger, build_ledger
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


def _narrative(summary: str) -> str:
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
    current = summary_index(view)
    if current is not None:
        at, new_from = current, current + 1
        start_orig = previous.summary_at
        old_end_orig = previous.summary_at + previous.covered
    else:
        at = new_from = view_index_of(view, anchor)
        start_orig = old_end_orig = anchor
    end_orig = view.origin[cut] if cut < len(view.messages) else len(view.original)
    # Kept verbatim after the summary: the current last user message and pinned steps only. An
    # earlier last user message kept by a previous summary goes into this one's ledger (the
    # user's words, verbatim, in order): left after the summary, it would read as newer than a
    # correction the summary holds.
    keep = sorted(set(pinned or ()) & set(range(start_orig, end_orig)))
    # Edits are artifacts: each covered edit's content is saved, and the ledger names it.
    artifacts: dict[str, tuple[str, str]] | None = {} if ctx.edit_artifacts else None
    ledger = build_ledger(
        view.original,
        old_end_orig,
        end_orig,
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
    replaced = [
        (m, o)
        for m, o in zip(view.messages[new_from:cut], view.origin[new_from:cut], strict=True)
        if o not in keep
    ]
    if ctx.transcripts:
        ledger = _save_transcript(view, ledger, replaced)
    handles = [*previous.handles, *view.offloads]
    ledger = ledger.with_handles(handles)
    previous_text = previous.summary.get("content") if previous.summary else None
    request = SummaryRequest(
        previous_summary=previous_text if isinstance(previous_text, str) else None,
        messages=[m for m, _ in replaced],
        ledger=ledger,
        prompt_family=family,
    )
    result = await _summarize(ctx, request)
    if not result.text.strip() and previous_text is not None:
        # A ledger-only summary (the safeguard's fold, a failed model call) keeps the narrative
        # an earlier model summary wrote: the ledger is rebuilt, the story is not lost.
        result = replace(result, text=_narrative(previous_text))
    ledger_text, ledger_saved = render_ledger(ledger, ctx)
    _add_offloads(view, previous, ledger_saved)
    handles = [*handles, *ledger_saved]
    message: Message = {"role": "user", "content": summary_content(result.text, ledger_text)}
    view.replace_messages(
        [*view.messages[:at], message, *(view.original[i] for i in keep), *view.messages[cut:]],
        mechanism,
        origin=[*view.origin[:at], -1, *keep, *view.origin[cut:]],
    )
    covered = view.original[start_orig:end_orig]
    gone = (
        {ctx.digests.at(start_orig + i, m) for i, m in enumerate(covered)}
        if (previous.placeholders or previous.dropped)
        else set()
    )
    view.checkpoint = replace(
        previous,
        summary=message,
        summary_at=start_orig,
        covered=end_orig - start_orig,
        pinned=tuple(keep),
        covered_digest=ctx.digests.range(covered),
        placeholders={d: m for d, m in previous.placeholders.items() if d not in gone},
        dropped=frozenset(d for d in previous.dropped if d not in gone),
        ledger=ledger,
        handles=tuple(dict.fromkeys(handles)),
    )
    view.decided = True
    view.facts.summary = _summary_fact(result, (start_orig, end_orig), view.checkpoint.covered_digest)


def _summary_fact(result: SummaryResult, covered: tuple[int, int], digest: str) -> SummaryFact:
    return SummaryFact(
        model=result.model,
        prompt_family=result.prompt_family,
        prompt_version=result.prompt_version,
        input_tokens=result.input_tokens,
        output_tokens=result.output_tokens,
        seconds=round(result.seconds, 4),
        fallback_reason=result.fallback_reason,
        covered=covered,
        covered_digest=digest,
    )
