"""Evidence survival: did what a question needs reach the arm's view?

``visible``: every evidence string appears in the view (message text, or the values of a
tool call's arguments). ``recoverable``: the rest sits in offloaded outputs whose handles the
view names, so the model can read it back with ``read_tool_output``. ``lost``: otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import orjson

from policies.conversation import Message, message_text
from policies.handles import PATTERN
from replay.questions import strings_in

SURVIVAL_STATES = ("visible", "recoverable", "lost")
HANDLE_PATTERN = PATTERN


def message_texts(message: Message) -> list[str]:
    """The searchable text of one message: its content, and its calls' argument values."""
    texts = [message_text(message)]
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict):
                continue
            texts.append(str(function.get("name") or ""))
            raw = function.get("arguments")
            try:
                parsed = orjson.loads(raw) if isinstance(raw, str) else raw
            except orjson.JSONDecodeError:
                parsed = raw
            texts.extend(strings_in(parsed))
    return texts


def view_text(messages: Sequence[Message]) -> str:
    return "\n".join(text for message in messages for text in message_texts(message))


def handles_in(text: str) -> list[str]:
    return list(dict.fromkeys(HANDLE_PATTERN.findall(text)))


def survival(
    evidence: Sequence[str],
    view: Sequence[Message],
    read_output: Callable[[str], str | None],
) -> tuple[str, list[str]]:
    """(state, evidence strings lost). ``read_output(handle)`` returns a saved output."""
    text = view_text(view)
    missing = [item for item in evidence if item not in text]
    if not missing:
        return "visible", []
    saved = [content for handle in handles_in(text) if (content := read_output(handle)) is not None]
    lost = [item for item in missing if not any(item in content for content in saved)]
    return ("recoverable" if not lost else "lost"), lost


def survival_counts(states: Iterable[str]) -> dict[str, int]:
    counts = dict.fromkeys(SURVIVAL_STATES, 0)
    for state in states:
        counts[state] += 1
    return counts


def merge_counts(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    total = dict.fromkeys(SURVIVAL_STATES, 0)
    for item in counts:
        for key in SURVIVAL_STATES:
            total[key] += item.get(key, 0)
    return total
