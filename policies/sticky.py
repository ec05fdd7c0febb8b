"""A session's sticky decisions re-applied to the client's history before any stage runs.

The summary, the placeholders and the dropped messages of earlier requests come back byte for
byte, so between two compactions the prefix the upstream sees only grows. A summary whose
range the client's history no longer matches (or that now holds the last user message) is
dropped, and the decision made again; only the messages the checkpoint decided about are
visited and digested."""

from __future__ import annotations

from policies.conversation import Message, role, system_prefix_end
from policies.digests import Digests
from policies.view import Checkpoint, View


def apply_checkpoint(view: View, digests: Digests) -> None:
    """Re-apply the session's sticky decisions to the client's history."""
    checkpoint = view.checkpoint
    original = view.original
    start = 0
    head: list[Message] = []
    head_origin: list[int] = []
    if checkpoint.summary is not None:
        at, end = checkpoint.summary_at, checkpoint.summary_at + checkpoint.covered
        if end > len(original) or digests.range(original[at:end]) != checkpoint.covered_digest:
            view.facts.checkpoint_dropped = "client history diverged from the summarized range"
            view.checkpoint = Checkpoint(requests=checkpoint.requests)
            return
        # The last user message is a user-role message: a covered range without one cannot
        # hold it, and the whole history is parsed only when the range has one.
        covers_user = any(role(message) == "user" for message in original[at:end])
        last_user = view.original_conversation().last_user if covers_user else -1
        if at <= last_user < end and last_user not in checkpoint.pinned:
            # The summary holds what is now the last user message: the conversation reads
            # differently than when it was made (a second text action shows an agent whose user
            # messages are observations, and the task is the last real question). The last
            # user message is always sent verbatim, so the decision is made again.
            view.facts.checkpoint_dropped = "the summarized range holds the last user message"
            view.checkpoint = Checkpoint(requests=checkpoint.requests)
            return
        head = [*original[:at], checkpoint.summary, *(original[i] for i in checkpoint.pinned)]
        head_origin = [*range(at), -1, *checkpoint.pinned]
        start = end
    if checkpoint.guidance is not None:
        prefix_end = system_prefix_end(original)
        if not head:
            head, head_origin, start = list(original[:prefix_end]), list(range(prefix_end)), prefix_end
        insert_at = min(prefix_end, len(head))
        head.insert(insert_at, checkpoint.guidance)
        head_origin.insert(insert_at, -1)
    if not head and not checkpoint.placeholders and not checkpoint.dropped:
        return
    # Every message from ``start`` on goes as it is (copied as a list, not visited) unless the
    # checkpoint decided about it: only those are looked at, digested, replaced or dropped.
    messages, origin = [*head, *original[start:]], [*head_origin, *range(start, len(original))]
    shift = len(head) - start
    decided = _decided_indices(checkpoint)
    candidates = range(start, len(original)) if decided is None else sorted(decided)
    dropped: list[int] = []
    for index in candidates:
        if not start <= index < len(original):
            continue
        message = original[index]
        # A junk entry (null, a string) is never one the checkpoint replaced: it goes as it is.
        if isinstance(message, dict) and message.get("role") in ("tool", "user", "assistant"):
            digest = digests.at(index, message)
            if digest in checkpoint.dropped:
                dropped.append(index + shift)
            else:
                messages[index + shift] = checkpoint.placeholders.get(digest, message)
    for position in reversed(dropped):
        del messages[position], origin[position]
    view.messages, view.origin = messages, origin
    view.changed = messages != list(original)
    if view.changed:
        view.mechanisms.append("checkpoint")


def _decided_indices(checkpoint: Checkpoint) -> set[int] | None:
    """The client indices the checkpoint's placeholders and dropped messages are about (their
    keys are "index:digest"): only those messages are digested. None: any may be."""
    try:
        return {int(key.partition(":")[0]) for key in (*checkpoint.placeholders, *checkpoint.dropped)}
    except ValueError:
        return None
