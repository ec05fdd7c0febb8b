"""Dialect adapters: one per wire format the proxy compacts (see ``base.py``), and the doors:
which request (method and path) each one reads, and which provider such a request goes to."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.dialects.anthropic import AnthropicDialect
from proxy.dialects.base import Dialect
from proxy.dialects.chat import ChatDialect
from proxy.dialects.hidden_rounds import HiddenRounds
from proxy.dialects.responses import ResponsesDialect


@dataclass(frozen=True, slots=True)
class Door:
    """A route whose requests are compacted: the dialect that reads them and the provider
    (``upstream/providers.py``) they go to."""

    method: bytes
    path: bytes
    dialect: str
    provider: str
    title: str  # the API's name, for the documentation page


# Every other route, `/v1/responses/compact`, `GET /v1/responses/{id}` and
# `/v1/messages/count_tokens` included, is relayed verbatim.
DOORS: tuple[Door, ...] = (
    Door(b"POST", b"/v1/chat/completions", "chat", "openai", "OpenAI Chat Completions"),
    Door(b"POST", b"/v1/responses", "responses", "openai", "OpenAI Responses"),
    Door(b"POST", b"/v1/messages", "anthropic", "anthropic", "Anthropic Messages"),
)


def make_dialects(hidden: HiddenRounds | None = None) -> dict[str, Dialect]:
    """``hidden``: the read rounds Anthropic clients never saw (None in a worker process)."""
    return {"chat": ChatDialect(), "responses": ResponsesDialect(), "anthropic": AnthropicDialect(hidden)}


__all__ = ["DOORS", "Dialect", "Door", "make_dialects"]
