"""The actions in an assistant message: its tool calls, else the actions written in its text.

A tool call (Chat Completions' ``{"function": {"name", "arguments"}}``) is read by
``policies.actions.classify``. Agents without native tool calls write their actions as text:
``<function=name><parameter=...>`` blocks (SWE-agent, OpenHands' text mode), else the last
fenced command block of the message, which is the one the agent runs (mini-swe-agent's
```` ```mswea_bash_command ````, a bare fence in SWE-agent's text mode, ```` ```bash ````),
including SWE-agent's own commands (``open f``, ``create f``, ``edit a:b`` ... ``end_of_edit``).
"""

from __future__ import annotations

import functools
import re
from typing import Any

from policies.actions import (
    EDIT,
    FINISH,
    OTHER,
    READ,
    SEARCH,
    WRITE,
    Action,
    classify,
    parse_arguments,
    shell_action,
)
from policies.conversation import Message, message_text

_TEXT_FUNCTION = re.compile(r"<function=([\w.-]+)>(.*?)(?:</function>|$)", re.DOTALL)
_TEXT_PARAMETER = re.compile(r"<parameter=([\w.-]+)>\n?(.*?)\n?</parameter>", re.DOTALL)
# A fenced action block: ```bash, ```sh, ```shell, mini-swe-agent's ```mswea_bash_command, or a
# bare fence (SWE-agent's text mode).
_FENCED = re.compile(r"```(bash|sh|shell|console|mswea_bash_command|)[ \t]*\n(.*?)```", re.DOTALL)


def text_actions(text: str) -> list[Action]:
    """Actions written in an assistant's text: ``<function=...>`` blocks, else the last fenced
    command block (the agent runs that one)."""
    found = [
        classify(name, {k: v for k, v in _TEXT_PARAMETER.findall(body)}, native=False)
        for name, body in _TEXT_FUNCTION.findall(text)
    ]
    if found:
        return found
    blocks = _FENCED.findall(text)
    if not blocks:
        return []
    _language, body = blocks[-1]
    command = body.strip()
    if not command:
        return []
    return [_swe_agent_command(command) or shell_action("shell", {"command": command}, command, native=False)]


# SWE-agent's own commands (its text mode): ``open f``, ``create f``, ``edit 3:5`` ... ``end_of_edit``.
_SWE_EDIT = re.compile(r"^(edit|insert|append)\b[^\n]*\n(.*?)\n?end_of_(?:edit|insert|append)\s*$", re.DOTALL)
_SWE_READS = frozenset({"open", "goto", "scroll_up", "scroll_down"})
_SWE_SEARCHES = frozenset({"search_dir", "search_file", "find_file"})


def _swe_agent_command(command: str) -> Action | None:
    words = command.split(maxsplit=2)
    program = words[0] if words else ""
    args = {"command": command}
    edit = _SWE_EDIT.match(command)
    if edit:
        return Action("edit", EDIT, args, command=command, code=edit.group(2), native=False)
    if program == "open" and len(words) > 1:
        return Action("open", READ, args, command=command, path=words[1].strip("\"'"), native=False)
    if program in _SWE_READS:
        return Action(program, READ, args, command=command, native=False)
    if program == "create" and len(words) > 1:
        return Action("create", WRITE, args, command=command, path=words[1].strip("\"'"), native=False)
    if program in _SWE_SEARCHES:
        return Action(program, SEARCH, args, command=command, native=False)
    if program == "submit" and len(words) == 1:
        return Action("submit", FINISH, args, command=command, native=False)
    return None


def call_action(call: Any) -> Action:
    """The action of one Chat Completions tool call (a malformed call is an ``other``)."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return Action("", OTHER)
    name = function.get("name")
    name = name if isinstance(name, str) else ""
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        # Every compaction point reads the same calls again: remembered by their exact text.
        return _classified(name, arguments)
    return classify(name, parse_arguments(arguments))


@functools.lru_cache(maxsize=16384)
def _classified(name: str, arguments: str) -> Action:
    return classify(name, parse_arguments(arguments))


def actions_of(message: Message) -> list[Action]:
    """Every action in an assistant message: its tool calls, else actions written as text."""
    if not isinstance(message, dict):
        return []
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        return [call_action(call) for call in calls]
    return text_actions(message_text(message))
