"""What a compacting route writes down about a request once the compaction service has made
its view: the facts the observers read, the response's compaction headers, and what the
request's compaction span says."""

from __future__ import annotations

from typing import Any

from policies.pipeline import PolicyOutcome
from proxy.route.compaction import Compacted
from proxy.telemetry.exchange import Exchange, kept_for_event

Headers = list[tuple[bytes, bytes]]


def record_compaction(exchange: Exchange, compacted: Compacted, tenant: str, route_headers: Headers) -> None:
    """What the service did, for the observers and the response's headers."""
    outcome = compacted.outcome
    exchange.stream = compacted.stream
    if compacted.skipped:
        # A malformed history, NaN, a history the proxy cannot see: sent as it came.
        exchange.skipped = compacted.skipped
        route_headers.append((b"x-compaction-skipped", compacted.skipped.encode("ascii", "replace")))
    if outcome.trigger:
        exchange.view_changed = changed_messages(outcome)
    exchange.outcome, exchange.tenant, exchange.session = kept_for_event(outcome), tenant, compacted.session
    exchange.model, exchange.messages_before = compacted.model, compacted.messages
    exchange.messages_after = len(outcome.messages) if outcome.messages is not None else compacted.messages
    exchange.session_fork = compacted.session_fork
    exchange.dialect_notes = compacted.notes
    if outcome.offloads:
        exchange.offloaded_bytes = sum(
            len(o.content.encode("utf-8", "replace")) for o in outcome.offloads.values()
        )
    exchange.tokens_before = outcome.tokens_before
    exchange.tokens_after = outcome.tokens_after
    exchange.mechanisms = outcome.mechanisms
    exchange.trigger = outcome.trigger
    # A client history that diverged from its checkpoint (edited or truncated) is recorded.
    exchange.checkpoint_dropped = outcome.facts.checkpoint_dropped is not None
    route_headers.append((b"x-compaction-tokens-before", str(outcome.tokens_before).encode()))
    route_headers.append((b"x-compaction-tokens-after", str(outcome.tokens_after).encode()))
    if outcome.trigger is not None:
        route_headers.append((b"x-compaction-trigger", outcome.trigger.encode()))


def changed_messages(outcome: PolicyOutcome) -> tuple[int, ...]:
    """The view's positions that stand for a client message with new text (a placeholder, an
    excerpt): what the session page's diff marks as changed rather than kept."""
    view, original, origin = outcome.messages, outcome.original, outcome.origin
    if view is None or origin is None or not original:
        return ()
    return tuple(
        at
        for at, (message, index) in enumerate(zip(view, origin, strict=False))
        if 0 <= index < len(original) and message is not original[index] and message != original[index]
    )


def compaction_attributes(exchange: Exchange) -> dict[str, Any]:
    """What a compaction span says: the policy, whether and why it compacted, the counts."""
    return {
        "compaction.policy": exchange.policy,
        "compaction.mode": exchange.mode,
        "compaction.trigger": exchange.trigger,
        "compaction.mechanisms": ",".join(exchange.mechanisms) or None,
        "compaction.tokens_before": exchange.tokens_before,
        "compaction.tokens_after": exchange.tokens_after,
        "compaction.skipped": exchange.skipped,
    }
