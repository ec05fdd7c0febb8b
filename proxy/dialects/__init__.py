"""Dialect adapters: one per wire format the proxy compacts (see ``base.py``)."""

from __future__ import annotations

from proxy.dialects.base import Dialect
from proxy.dialects.chat import ChatDialect

# POST routes whose requests are compacted, and the dialect that reads them.
ROUTES: dict[bytes, str] = {
    b"/v1/chat/completions": "chat",
}


def make_dialects() -> dict[str, Dialect]:
    return {"chat": ChatDialect()}


__all__ = ["ROUTES", "Dialect", "make_dialects"]
