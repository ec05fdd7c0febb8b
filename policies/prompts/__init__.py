"""Versioned summary prompt families, and the messages a summarizer model receives.

Each family is a Markdown file with a small front matter (``family``, ``version``); the
version goes into every compaction event, so a prompt change is visible in the data.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

import orjson

from policies.conversation import Message, message_text, role
from policies.summarizer import SummaryRequest

FAMILIES = ("sre", "generic", "hybrid", "hybrid_v2")
MAX_MESSAGE_CHARS = 8_000


@dataclass(frozen=True, slots=True)
class Prompt:
    family: str
    version: str
    text: str


@cache
def load_prompt(family: str) -> Prompt:
    if family not in FAMILIES:
        raise ValueError(f"unknown prompt family {family!r}; known: {', '.join(FAMILIES)}")
    raw = resources.files(__name__).joinpath(f"{family}.md").read_text(encoding="utf-8")
    _, front, body = raw.split("---", 2)
    meta = dict(line.split(":", 1) for line in front.strip().splitlines())
    return Prompt(family=meta["family"].strip(), version=meta["version"].strip(), text=body.strip())


def _render(message: Message) -> str:
    """One history message as plain text for the summarizer; long outputs are clipped in the
    middle (the ledger and the saved outputs keep them exact)."""
    text = message_text(message)
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        rendered = []
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                rendered.append(f"call {function.get('name')}({function.get('arguments')})")
            else:
                rendered.append(orjson.dumps(call).decode())
        text = (text + "\n" if text else "") + "\n".join(rendered)
    if len(text) > MAX_MESSAGE_CHARS:
        half = MAX_MESSAGE_CHARS // 2
        text = f"{text[:half]}\n[... {len(text) - MAX_MESSAGE_CHARS} characters omitted ...]\n{text[-half:]}"
    label = role(message) or "message"
    if label == "tool" and message.get("name"):
        label = f"tool {message.get('name')}"
    return f"### {label}\n{text}"


def _fit(rendered: list[str], budget: int) -> list[str]:
    """Rendered messages within ``budget`` characters: long ones shortened in the middle
    first, then the oldest left out (the ledger keeps their exact facts)."""
    cap = MAX_MESSAGE_CHARS
    while sum(map(len, rendered)) > budget and cap > 500:
        cap //= 2
        rendered = [_clip(text, cap) for text in rendered]
    kept: list[str] = []
    used = 0
    for text in reversed(rendered):
        if used + len(text) > budget:
            break
        kept.append(text)
        used += len(text)
    omitted = len(rendered) - len(kept)
    note = [f"[... {omitted} earlier messages omitted to fit the summarizer's input ...]"] if omitted else []
    return note + kept[::-1]


def _clip(text: str, cap: int) -> str:
    if len(text) <= cap:
        return text
    half = cap // 2
    return f"{text[:half]}\n[... {len(text) - cap} characters omitted ...]\n{text[-half:]}"


def summary_messages(request: SummaryRequest, max_chars: int | None = None) -> tuple[Prompt, list[Message]]:
    """The chat messages that ask a model for the summary of ``request``; with ``max_chars``
    the whole input (prompt included) stays within that many characters."""
    prompt = load_prompt(request.prompt_family)
    parts = []
    if request.previous_summary:
        parts.append("## Previous summary\n" + request.previous_summary)
    rendered = [_render(m) for m in request.messages]
    if max_chars is not None:
        budget = max_chars - len(prompt.text) - sum(map(len, parts)) - 200
        rendered = _fit(rendered, max(1000, budget))
    parts.append("## Conversation to summarize\n" + "\n\n".join(rendered))
    return prompt, [
        {"role": "system", "content": prompt.text},
        {"role": "user", "content": "\n\n".join(parts)},
    ]
