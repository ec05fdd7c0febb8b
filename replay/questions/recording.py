"""The recorded run as the question builders read it: its searchable texts, its actions
paired with their results, its observations and the task repository's root.

Every kind reads the same recording, so these readers live apart from any one kind.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from policies.actions import Action
from policies.conversation import message_text, role, tool_call_ids
from policies.message_actions import actions_of
from replay.questions.question import ARGUMENTS, CONTENT
from replay.recording.cases import Case

# How agents frame what a tool reported: text actions' observations open with a label, and
# OpenHands appends the interpreter it ran; neither is part of what the program printed.
OBSERVATION_PREFIX = re.compile(r"^(?:OBSERVATION:\s*\n|Observation: )")
INTERPRETER_SUFFIX = re.compile(r"\[Python [Ii]nterpreter: [^\]]*\]")

_UPLOADED = re.compile(r"<uploaded_files>\s*(\S+?)\s*</uploaded_files>")
_CURRENT_DIRECTORY = re.compile(r"\(Current directory: (/[^)\s]*)\)")
_WORKING_DIRECTORY = re.compile(r"\[Current working directory: (/[^\]\s]*)\]")


# --- the history as text -------------------------------------------------------------------


def strings_in(value: Any) -> Iterator[str]:
    """Every string inside a JSON value (tool-call arguments), depth first."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings_in(item)


def history_texts(case: Case) -> list[tuple[int, str, str]]:
    """(message index, CONTENT or ARGUMENTS, text) for every searchable text of the history:
    each message's content, and each string value of a native tool call's parsed arguments."""
    texts: list[tuple[int, str, str]] = []
    for index, message in enumerate(case.messages):
        text = message_text(message)
        if text:
            texts.append((index, CONTENT, text))
        if tool_call_ids(message) or isinstance(message.get("tool_calls"), list):
            for action in actions_of(message):
                texts.extend((index, ARGUMENTS, value) for value in strings_in(action.args) if value)
    return texts


def locate_path(texts: Sequence[tuple[int, str, str]], path: str, root: str | None) -> tuple[int, str] | None:
    """(message index, CONTENT or ARGUMENTS) of the first text naming a repository-relative
    path: not part of a longer name, and after a slash only when that slash ends the
    repository root (or the root is unknown)."""
    before = [r"(?<![\w./-])", r"(?<=[\s'\"`(=]\./)"]
    before.append(rf"(?<={re.escape(root.rstrip('/'))}/)" if root else r"(?<=/)")
    pattern = re.compile(rf"(?:{'|'.join(before)}){re.escape(path)}(?![\w-])")
    for index, where, text in texts:
        if path in text and pattern.search(text):
            return index, where
    return None


# --- actions and their results -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordedAction:
    index: int  # the assistant message
    action: Action
    native: bool
    result: str  # text of its result or observation, "" if none
    result_index: int | None

    @property
    def args(self) -> dict[str, Any]:
        return self.action.args


def recorded_actions(case: Case) -> list[RecordedAction]:
    """Every action of the run, in order, each with the result or observation it got."""
    messages = case.messages
    found: list[RecordedAction] = []
    for index, message in enumerate(messages):
        if role(message) != "assistant":
            continue
        actions = actions_of(message)
        if not actions:
            continue
        ids = tool_call_ids(message)
        if ids:
            # Results follow their calls; match them in order (ids may repeat across a run).
            block: list[int] = []
            end = index + 1
            while end < len(messages) and role(messages[end]) == "tool":
                block.append(end)
                end += 1
            used: set[int] = set()
            for position, action in enumerate(actions):
                call_id = ids[position] if position < len(ids) else None
                result_index = next(
                    (i for i in block if i not in used and messages[i].get("tool_call_id") == call_id), None
                )
                if result_index is not None:
                    used.add(result_index)
                result = message_text(messages[result_index]) if result_index is not None else ""
                found.append(RecordedAction(index, action, True, result, result_index))
        else:
            following = index + 1
            observed = following < len(messages) and role(messages[following]) == "user"
            result_index = following if observed else None
            result = message_text(messages[following]) if observed else ""
            found.extend(RecordedAction(index, action, False, result, result_index) for action in actions)
    return found


def observations(case: Case) -> Iterator[tuple[int, str]]:
    """(index, text) of every tool result and text-action observation, in order."""
    messages = case.messages
    for index, message in enumerate(messages):
        kind = role(message)
        if kind == "tool" or (
            kind == "user"
            and index > 0
            and role(messages[index - 1]) == "assistant"
            and not tool_call_ids(messages[index - 1])
            and actions_of(messages[index - 1])
        ):
            yield index, message_text(message)


def repo_root(case: Case) -> str | None:
    """The task repository's root: the uploaded directory of the task, else the first
    working directory an observation reports."""
    for message in case.messages:
        if role(message) == "user":
            match = _UPLOADED.search(message_text(message))
            if match:
                return posixpath.normpath(match.group(1))
    for _index, text in observations(case):
        match = _CURRENT_DIRECTORY.search(text) or _WORKING_DIRECTORY.search(text)
        if match:
            return posixpath.normpath(match.group(1))
    return None
