"""Handles of saved outputs: created, written into a view, and recognized, in one place.

A handle names a text the proxy saved outside the conversation (``out_`` and 16 hex digits of
the text's hash, so the same text always gets the same handle). A view mentions it as
``handle=out_...`` in a placeholder (an offloaded output), an excerpt (an output cut to fit
the window), a retry note or the ledger; the model reads it back with ``read_tool_output``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any

from policies.conversation import message_text

PREFIX = "out_"
# How a view names a handle; the proxy offers the read tool only when a view does.
MENTION = "handle=" + PREFIX
PATTERN = re.compile(r"\bhandle=['\"]?(out_[0-9a-f]{16})")
PLACEHOLDER_PREFIX = "[Output saved outside the context: handle="
EXCERPT_PREFIX = "[Output cut to fit the context window: handle="


def new_handle(content: str) -> str:
    """Content-addressed handle of a saved text: the same text, the same handle."""
    return PREFIX + hashlib.blake2b(content.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def mention(handle: str) -> str:
    return f"handle={handle}"


def normalize(argument: str) -> str:
    """A handle as the model passes it back (``handle=out_...`` or ``out_...``)."""
    return argument.strip().removeprefix("handle=").strip("'\"")


def handles_in(text: str) -> list[str]:
    return PATTERN.findall(text)


def names_a_handle(messages: Iterable[Any]) -> bool:
    return any(MENTION in message_text(m) for m in messages)


def read_hint(handle: str) -> str:
    return f"read_tool_output(handle={handle!r}, start_line, num_lines, pattern)"


def placeholder_text(handle: str, description: str) -> str:
    """The text that stands for an offloaded output."""
    return f"{PLACEHOLDER_PREFIX}{handle}]\n{description}\nRead it with {read_hint(handle)}."


def is_placeholder(text: str) -> bool:
    return text.startswith(PLACEHOLDER_PREFIX)


def excerpt_text(handle: str, description: str, head: str, tail: str, omitted: int) -> str:
    """The text that stands for an output cut to fit the window: its head and tail."""
    return (
        f"{EXCERPT_PREFIX}{handle}]\n{description}\n--- start ---\n{head}\n"
        f"[... {omitted} lines omitted ...]\n{tail}\n--- end ---\n"
        f"Read all of it with {read_hint(handle)}."
    )


def is_excerpt(text: str) -> bool:
    return text.startswith(EXCERPT_PREFIX)
