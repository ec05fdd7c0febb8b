"""Agents that compact by themselves: recognizing their summarization requests.

Codex CLI, Claude Code and Gemini CLI summarize their own history with an ordinary request
(Codex marks it with ``x-codex-turn-metadata`` ``request_kind: compaction``; Claude Code's
carries its summary prompt as the last user message; Gemini CLI's two, the ``<state_snapshot>``
and its "critically evaluate" pass, too). The proxy's decision, documented in the README: such a
request is the agent's own summarizer at work, so it goes upstream **as the agent sent it**
whenever it fits the model's window (compacting it would summarize a summary request and hand
the agent a summary of a view), and is compacted like any request only when it does not fit
(the agent's summarizer then gets a view that fits, ledger included, instead of an error). Either
way it is recorded in the compaction event (``dialect_notes.agent_compaction``). The request
after it starts a new session: its history no longer extends the old one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from policies.conversation import message_text, role

_CODEX_KIND = re.compile(rb'"request_kind"\s*:\s*"compaction"')
# Claude Code's /compact (and auto-compact) prompt, as it opens its last user message.
_CLAUDE_PROMPTS = (
    "create a detailed summary of the conversation so far",
    "Your task is to create a detailed summary",
)
# Gemini CLI's chat compression: the snapshot request, then its verification pass.
_GEMINI_PROMPTS = ("Generate a new <state_snapshot>", "Critically evaluate the <state_snapshot>")


def agent_compaction(
    headers: Sequence[tuple[bytes, bytes]], messages: Sequence[Any], last_user: int | None = None
) -> str | None:
    """The agent whose own compaction request this is, or None. ``last_user``: the index of the
    last user message when it is known already (-1: there is none)."""
    for name, value in headers:
        if name == b"x-codex-turn-metadata" and _CODEX_KIND.search(value):
            return "codex"
    # The last user message (an agent's history is mostly assistant and tool messages behind it).
    if last_user is None:
        last = next((m for m in reversed(messages) if role(m) == "user"), None)
    else:
        last = messages[last_user] if last_user >= 0 else None
    if last is not None:
        text = message_text(last)[:4000]
        if any(prompt in text for prompt in _CLAUDE_PROMPTS):
            return "claude-code"
        if any(prompt in text for prompt in _GEMINI_PROMPTS):
            return "gemini-cli"
    return None


def passes_as_sent(
    agent: str, prompt_tokens: int, window: int, requested: int
) -> tuple[str | None, dict[str, str]]:
    """Whether the agent's own compaction request goes as sent (it fits the window, with the
    answer it asks for and at least 1,024 tokens kept for it): the reason it is not compacted,
    or None; and the note for the compaction event. The same rule for every body size."""
    fits = prompt_tokens <= window - max(1024, requested)
    note = {"agent": agent, "action": "forwarded as sent" if fits else "compacted to fit the window"}
    return (f"{agent}'s own compaction request" if fits else None), note
