"""Dialect adapters: one per wire format the proxy compacts (see ``base.py``)."""

from __future__ import annotations

from proxy.dialects.anthropic import AnthropicDialect
from proxy.dialects.base import Dialect
from proxy.dialects.chat import ChatDialect
from proxy.dialects.responses import ResponsesDialect

# POST routes whose requests are compacted, and the dialect that reads them. (Every other route,
# `/v1/responses/compact`, `GET /v1/responses/{id}` and `/v1/messages/count_tokens` included, is
# relayed verbatim.)
ROUTES: dict[bytes, str] = {
    b"/v1/chat/completions": "chat",
    b"/v1/responses": "responses",
    b"/v1/messages": "anthropic",
}


def make_dialects() -> dict[str, Dialect]:
    return {"chat": ChatDialect(), "responses": ResponsesDialect(), "anthropic": AnthropicDialect()}


__all__ = ["ROUTES", "Dialect", "make_dialects"]
