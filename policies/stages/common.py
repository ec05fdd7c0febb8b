"""Helpers shared by stages: safe boundaries and the summary message's text."""

from __future__ import annotations

from policies.conversation import Conversation

SUMMARY_HEADER = "[Summary of the earlier conversation, written by the context manager]"


def first_safe_cut_at_or_after(conversation: Conversation, index: int) -> int:
    """Move a boundary toward newer messages until it does not split a step."""
    for cut in conversation.safe_cuts:
        if cut >= index:
            return cut
    return len(conversation.messages)


def summary_content(narrative: str, ledger_text: str) -> str:
    parts = [SUMMARY_HEADER]
    if narrative.strip():
        parts.append(narrative.strip())
    parts.append(ledger_text)
    return "\n\n".join(parts)
