"""Handles of saved outputs: created, written into a view, and recognized, in one place.

A handle names a text the proxy saved outside the conversation (``out_`` and 16 hex digits of
the text's hash, so the same text always gets the same handle). A view mentions it as
``handle=out_...`` in a placeholder (an offloaded output, or a large body of an edit in its
call's arguments), an excerpt (an output cut to fit the window), a retry note or the ledger;
the model reads it back with ``read_tool_output``.
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
# Stands for a large body of an agent's own edit (a file's text, a patch) in its call.
ARGUMENT_PREFIX = "[Argument saved outside the context: handle="
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


def _arguments(message: Any) -> Iterable[str]:
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if isinstance(arguments, str):
            yield arguments


def names_a_handle(messages: Iterable[Any]) -> bool:
    """Whether a view names a saved text: in a message's text or a call's arguments (an
    offloaded edit)."""
    return any(MENTION in message_text(m) or any(MENTION in a for a in _arguments(m)) for m in messages)


def read_hint(handle: str) -> str:
    return f"read_tool_output(handle={handle!r}, start_line, num_lines, pattern)"


def placeholder_text(handle: str, description: str) -> str:
    """The text that stands for an offloaded output."""
    return f"{PLACEHOLDER_PREFIX}{handle}]\n{description}\nRead it with {read_hint(handle)}."


def argument_placeholder(handle: str, description: str) -> str:
    """The text that stands for a large body of an edit in its call's arguments."""
    return f"{ARGUMENT_PREFIX}{handle}]\n{description}\nRead it with {read_hint(handle)}."


def is_placeholder(text: str) -> bool:
    return text.startswith(PLACEHOLDER_PREFIX)


# A superseded or stale output's note: one line, the placeholder's prefix (so every stage and
# the transcript treat it as a placeholder), its status and why, what it was, and the read hint.
_SUPERSEDED = re.compile(
    re.escape(PLACEHOLDER_PREFIX) + r"(out_[0-9a-f]{16})\] (Superseded|Stale) \(([^)\n]*)\): `([^`\n]*)`"
)


def superseded_text(handle: str, status: str, why: str, target: str, size: str) -> str:
    """The one-line note that stands for an output a later one replaced: ``status`` is
    Superseded or Stale, ``why`` says what came later, ``target`` is the file or command (one
    line, no backquote), ``size`` what the output held."""
    flat = " ".join(target.split()).replace("`", "'")
    head = f"{PLACEHOLDER_PREFIX}{handle}] {status} ({why}): `{flat}`, {size}. "
    return head + f"Read it with {read_hint(handle)}."


def superseded_of(text: str) -> tuple[str, str, str, str] | None:
    """(handle, status, why, target) of a superseded output's note, else None."""
    found = _SUPERSEDED.match(text)
    return (found.group(1), found.group(2), found.group(3), found.group(4)) if found else None


def excerpt_text(handle: str, description: str, head: str, tail: str, omitted: int) -> str:
    """The text that stands for an output cut to fit the window: its head and tail."""
    return (
        f"{EXCERPT_PREFIX}{handle}]\n{description}\n--- start ---\n{head}\n"
        f"[... {omitted} lines omitted ...]\n{tail}\n--- end ---\n"
        f"Read all of it with {read_hint(handle)}."
    )


def is_excerpt(text: str) -> bool:
    return text.startswith(EXCERPT_PREFIX)
