"""Edits are artifacts: what an edit wrote, saved under a handle like a tool output.

An agent's own edits (a file created, a ``str_replace``, a ``MultiEdit``, an ``apply_patch``
body, a heredoc in a shell command) live in its tool-call arguments, or in its text for agents
that write actions as text. A summary drops them like any other message, so the code the agent
wrote is lost unless it is saved: ``edit_artifact`` reads an action (through the shared action
vocabulary) into the text saved under its handle (the whole call, readable: the short fields on
a header line, every long string verbatim under its name) and the *bodies*, the long strings a
view may replace by a placeholder naming that handle. The handle is content-addressed, so the
offload stage (which replaces large bodies in place) and the ledger (which lists every edit of
a summarized range by file) name the same edit by the same handle.

``offload_edits`` rewrites one assistant message: a native call keeps its id, its name and a
JSON object of arguments whose small identifying fields (path, command, file_path) stay as they
are and whose large bodies become placeholders; a text action keeps its text with the bodies
replaced. Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from policies.actions import EDIT, PATCH, SHELL, WRITE, Action
from policies.conversation import Message, role
from policies.handles import ARGUMENT_PREFIX, argument_placeholder, new_handle
from policies.message_actions import call_action, text_actions
from policies.shell_commands import HEREDOC
from policies.tokens import json_text

# A string argument at least this long is a body (the rest identifies the call and stays).
MIN_BODY_CHARS = 200
# Scalars up to this length go on the saved text's header line.
_HEADER_CHARS = 120
_PATH_KEYS = frozenset(
    {"path", "file_path", "filepath", "filename", "file", "notebook_path", "target_file", "absolute_path"}
)
_SHELL_LABEL = "shell"


@dataclass(frozen=True, slots=True)
class EditArtifact:
    """One edit: ``label`` names what it did (``create``, ``str_replace``, ``Write``,
    ``apply_patch``, ``heredoc``...), ``paths`` the files it writes (empty: unknown),
    ``text`` is saved under ``handle``; ``bodies`` are the long strings a view may replace."""

    tool: str
    label: str
    paths: tuple[str, ...]
    text: str
    bodies: tuple[str, ...]
    handle: str
    size: int  # characters of the new text it writes (of the whole call when unknown)

    def description(self) -> str:
        where = ", ".join(self.paths) or "(path unknown)"
        lines = self.text.count("\n") + 1
        return f"edit: {self.tool} {self.label} {where} | {lines} lines, {len(self.text)} chars"


def _leaves(value: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """(key path, value) of every scalar in a JSON value, in order."""
    if isinstance(value, dict):
        for name, item in value.items():
            yield from _leaves(item, f"{key}.{name}" if key else str(name))
    elif isinstance(value, list):
        for position, item in enumerate(value):
            yield from _leaves(item, f"{key}[{position}]")
    else:
        yield key, value


def _last_key(path: str) -> str:
    return path.rsplit(".", 1)[-1].split("[", 1)[0]


def saved_text(tool: str, args: dict[str, Any]) -> str:
    """The whole call, readable: ``tool(short=fields)`` then every long or multi-line string
    verbatim under a ``--- name ---`` line (never JSON-escaped, so code reads as written)."""
    header: list[str] = []
    sections: list[str] = []
    for key, value in _leaves(args):
        if isinstance(value, str) and ("\n" in value or len(value) > _HEADER_CHARS):
            sections.append(f"--- {key} ---\n{value}")
        else:
            shown = value if isinstance(value, str) else json_text(value)
            header.append(f"{key}={shown}")
    return "\n".join([f"{tool}({', '.join(header)})", *sections])


def _label(action: Action) -> str:
    sub = action.args.get("command")
    if action.kind == SHELL:
        return "heredoc" if HEREDOC.search(action.command or "") else _SHELL_LABEL
    if isinstance(sub, str) and sub and " " not in sub.strip() and "\n" not in sub:
        return sub  # an editor's sub-command: create, str_replace, insert
    return action.tool or action.kind


def _bodies(action: Action) -> tuple[str, ...]:
    if action.kind == SHELL:
        return tuple(body for _q, _m, body in HEREDOC.findall(action.command or "") if body.strip())
    if not action.native and set(action.args) == {"command"} and action.code:
        return (action.code,)  # SWE-agent's `edit 3:5 ... end_of_edit`: the body, not the line
    return tuple(
        value
        for key, value in _leaves(action.args)
        if isinstance(value, str) and len(value) >= MIN_BODY_CHARS and _last_key(key) not in _PATH_KEYS
    )


def edit_artifact(action: Action) -> EditArtifact | None:
    """The artifact of an action that writes files (an edit, a write, a patch, a shell command
    with a heredoc or a write target), or None."""
    if action.kind in (EDIT, WRITE, PATCH):
        paths = action.paths or ((action.path,) if action.path else ())
    elif action.kind == SHELL and action.command and (action.paths or HEREDOC.search(action.command)):
        paths = action.paths
    else:
        return None
    text = saved_text(action.tool or action.kind, action.args)
    bodies = _bodies(action)
    return EditArtifact(
        tool=action.tool or action.kind,
        label=_label(action),
        paths=tuple(dict.fromkeys(paths)),
        text=text,
        bodies=bodies,
        handle=new_handle(text),
        size=len(action.code) if action.code else sum(len(b) for b in bodies) or len(text),
    )


def _placeholders(artifact: EditArtifact) -> dict[str, str]:
    """Each long body and the placeholder that stands for it (a body that ends a line keeps
    its line end, so a heredoc's closing marker stays on a line of its own)."""
    out: dict[str, str] = {}
    for body in artifact.bodies:
        if len(body) < MIN_BODY_CHARS or body in out or body.startswith(ARGUMENT_PREFIX):
            continue
        first = next((line.strip() for line in body.splitlines() if line.strip()), "")
        description = (
            f"{artifact.tool} {artifact.label} {', '.join(artifact.paths) or ''}".rstrip()
            + f" | ran already | {body.count(chr(10)) + 1} lines, {len(body)} chars"
            + (f" | first: {first[:80]!r}" if first else "")
        )
        end = "\n" if body.endswith("\n") else ""
        out[body] = argument_placeholder(artifact.handle, description) + end
    return out


def _replace_in(value: Any, swaps: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _replace_in(v, swaps) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_in(v, swaps) for v in value]
    if isinstance(value, str):
        if value in swaps:
            return swaps[value]
        for body, placeholder in swaps.items():
            if body in value:  # a heredoc inside a command, a patch inside an argv
                value = value.replace(body, placeholder, 1)
        return value
    return value


def _offload_call(call: Any, min_tokens: int, count: Callable[[str], int]) -> tuple[Any, EditArtifact] | None:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return None
    arguments = function.get("arguments")
    if not isinstance(arguments, str) or not arguments.lstrip().startswith("{"):
        return None
    artifact = edit_artifact(call_action(call))
    if artifact is None:
        return None
    swaps = _placeholders(artifact)
    if not swaps or sum(count(body) for body in swaps) < min_tokens:
        return None
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(parsed, dict):
        return None
    rewritten = json_text(_replace_in(parsed, swaps))
    return {**call, "function": {**function, "arguments": rewritten}}, artifact


def offload_edits(
    message: Message, min_tokens: int, count: Callable[[str], int]
) -> tuple[Message, list[EditArtifact]] | None:
    """``message`` with the bodies of its large edits replaced by placeholders, and the
    artifacts to save; None when no edit of it is large (at least ``min_tokens`` of bodies)."""
    if role(message) != "assistant":
        return None
    calls = message.get("tool_calls")
    saved: list[EditArtifact] = []
    if isinstance(calls, list) and calls:
        new_calls = []
        for call in calls:
            done = _offload_call(call, min_tokens, count)
            if done is not None:
                call = done[0]
                saved.append(done[1])
            new_calls.append(call)
        return ({**message, "tool_calls": new_calls}, saved) if saved else None
    content = message.get("content")
    if not isinstance(content, str):
        return None
    for action in text_actions(content):
        artifact = edit_artifact(action)
        swaps = _placeholders(artifact) if artifact is not None else {}
        if artifact is None or not swaps or sum(count(b) for b in swaps) < min_tokens:
            continue
        for body, placeholder in swaps.items():
            content = content.replace(body, placeholder, 1)
        saved.append(artifact)
    return ({**message, "content": content}, saved) if saved else None
