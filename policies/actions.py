"""The shared vocabulary of agent actions: what a tool call or a text action *does*.

Agents name the same few actions differently: OpenHands calls ``execute_bash(command)`` and
``str_replace_editor(command, path, old_str, new_str)``, Claude Code ``Bash(command)``,
``Read(file_path)`` and ``Edit(file_path, old_string, new_string)``, Codex CLI
``shell(command=[argv])``, ``exec_command(cmd)`` and ``apply_patch`` envelopes,
mini-swe-agent writes ```` ```mswea_bash_command ```` blocks or calls ``bash(command)``.
Every part of the project that needs to know what an agent did (the state ledger, offload
descriptions, retry collapse, shadow decision signatures, the replay questions) asks this
module, so a new agent's tool schema is taught in one place. ``policies.message_actions``
finds the actions in a message (its tool calls, or the actions an agent writes as text) and
reads each one here.

An ``Action`` is a normalized reading of one call: its ``kind`` (``shell``, ``read``,
``edit``, ``write``, ``patch``, ``search``, ``plan``, ``finish``, ``think`` or ``other``),
the shell ``command`` as one line, the file ``path`` (and every path a patch touches), the
new ``code`` an edit writes and the ``old`` text it replaces, and open ``plan`` items.
Unknown tools fall back on their arguments: an argument that is a path, a command or a patch.
Nothing is inferred beyond what the call itself says.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from policies.shell_commands import (
    HEREDOC,
    is_patch,
    patch_added_text,
    patch_paths,
    shell_command,
    shell_read_target,
    shell_write_targets,
)

SHELL = "shell"
READ = "read"
EDIT = "edit"
WRITE = "write"
PATCH = "patch"
SEARCH = "search"
PLAN = "plan"
FINISH = "finish"
THINK = "think"
OTHER = "other"
# Kinds that change files.
EDIT_KINDS = frozenset({EDIT, WRITE, PATCH})


@dataclass(frozen=True, slots=True)
class Action:
    tool: str
    kind: str
    args: dict[str, Any] = field(default_factory=dict)
    command: str | None = None
    path: str | None = None
    # Every file a patch or a shell command writes (the path of an edit is ``path``).
    paths: tuple[str, ...] = ()
    code: str | None = None  # the new text an edit, write or patch puts in the file
    old: str | None = None  # the text an edit replaces
    plan: tuple[tuple[str, str], ...] | None = None  # (item, status) of a plan update
    native: bool = True  # a tool call (False: written as text in the message)

    def _replace_tool(self, tool: str) -> Action:
        return replace(self, tool=tool)

    @property
    def changes_files(self) -> bool:
        return self.kind in EDIT_KINDS or (self.kind == SHELL and bool(self.paths))

    @property
    def target(self) -> str:
        """What the action is about, normalized: the path of a file action, the command of a
        shell call (whitespace folded), else the tool's main argument."""
        if self.kind in (READ, EDIT, WRITE) and self.path:
            return self.path
        if self.kind == PATCH:
            return ", ".join(self.paths) or (self.path or "")
        if self.kind == SEARCH:
            pattern = self.args.get("pattern", self.args.get("query"))
            where = f" in {self.path}" if self.path else ""
            return f"{pattern}{where}" if isinstance(pattern, str) else (self.command or self.path or "")
        if self.command is not None:
            return " ".join(self.command.split())
        if self.path:
            return self.path
        for key in ("pattern", "query", "url", "message", "description"):
            value = self.args.get(key)
            if isinstance(value, str) and value:
                return " ".join(value.split())[:200]
        return ""

    @property
    def signature(self) -> str:
        """``tool: target``: two actions with one signature do the same thing."""
        return f"{self.tool}: {self.target}".strip()

    def open_items(self) -> tuple[str, ...] | None:
        """Plan items not done yet, when this action updates a plan."""
        if self.plan is None:
            return None
        return tuple(item for item, status in self.plan if status not in _DONE)


_DONE = frozenset({"done", "completed", "complete", "cancelled", "canceled"})

# --- tool names, by what they do -------------------------------------------------------------

_SHELL_TOOLS = frozenset(
    {
        "execute_bash",  # OpenHands
        "bash",  # SWE-agent, mini-swe-agent tool-call mode, Anthropic's bash tool
        "Bash",  # Claude Code
        "shell",  # Codex CLI (argv list), generic
        "local_shell",
        "exec_command",  # Codex CLI (unified exec)
        "container.exec",
        "terminal",
        "run",
        "run_command",
        "execute_command",
        "run_shell",
        "run_terminal_cmd",  # Cursor
        "shell_command",
        "cmd",
    }
)
_EDITOR_TOOLS = frozenset(
    {"str_replace_editor", "str_replace_based_edit_tool", "file_editor", "edit_file", "text_editor"}
)
_READ_TOOLS = frozenset(
    {"Read", "read_file", "read_many_files", "view_file", "open_file", "cat", "NotebookRead", "view_image"}
)
_WRITE_TOOLS = frozenset({"Write", "write_file", "create_file", "write_to_file", "create"})
_SWE_EDIT_TOOLS = frozenset({"edit", "insert", "append"})
_EDIT_TOOLS = frozenset({"Edit", "MultiEdit", "NotebookEdit", "replace_in_file", "search_replace"})
_PATCH_TOOLS = frozenset({"apply_patch", "apply_diff"})
_SEARCH_TOOLS = frozenset(
    {
        "Grep",
        "Glob",
        "LS",
        "grep",
        "glob",
        "find_file",
        "search_dir",
        "search_file",
        "list_files",
        "list_dir",
        "codebase_search",
        "file_search",
        "grep_search",
        "search_file_content",  # Gemini CLI (its older name of grep_search)
        "list_directory",  # Gemini CLI
    }
)
_PLAN_TOOLS = frozenset({"task_tracker", "TodoWrite", "update_plan", "todo_write", "write_todos"})
_FINISH_TOOLS = frozenset({"finish", "submit", "attempt_completion", "task_complete"})
_THINK_TOOLS = frozenset({"think", "Think"})

_PATH_KEYS = (
    "path",
    "file_path",
    "filepath",
    "filename",
    "file",
    "notebook_path",
    "target_file",
    "absolute_path",
)
_COMMAND_KEYS = ("command", "cmd", "script", "shell_command")
_EDITOR_WRITES = frozenset({"create", "write"})
_EDITOR_EDITS = frozenset({"str_replace", "insert", "undo_edit", "edit", "append"})
_EDITOR_READS = frozenset({"view", "open", "cat", "read"})


def parse_arguments(raw: Any) -> dict[str, Any]:
    """A call's arguments as a mapping, whatever they arrived as (JSON text, a mapping, junk)."""
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return {"input": raw} if raw.strip() else {}
        return parsed if isinstance(parsed, dict) else {}
    return {}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _first_path(args: dict[str, Any]) -> str | None:
    for key in _PATH_KEYS:
        value = args.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


# --- classification ----------------------------------------------------------------------------


def _plan(items: Any, text_keys: tuple[str, ...]) -> tuple[tuple[str, str], ...] | None:
    if not isinstance(items, list):
        return None
    plan = []
    for item in items:
        if isinstance(item, dict):
            text = next((item[k] for k in text_keys if isinstance(item.get(k), str) and item[k]), None)
            plan.append((" ".join(str(text or item).split())[:200], str(item.get("status") or "")))
        elif isinstance(item, str):
            plan.append((" ".join(item.split())[:200], ""))
    return tuple(plan)


def shell_action(tool: str, args: dict[str, Any], command: str, native: bool) -> Action:
    """A shell command as an action: the files it writes, the file it shows, a patch it applies
    through a heredoc."""
    writes = shell_write_targets(command)
    heredoc_patch = None
    if "*** Begin Patch" in command:
        bodies = [body for _q, _m, body in HEREDOC.findall(command)]
        heredoc_patch = next((b for b in bodies if b.lstrip().startswith("*** Begin Patch")), None)
    read = None if writes else shell_read_target(command)
    return Action(
        tool=tool,
        kind=SHELL,
        args=args,
        command=command,
        path=read,
        paths=tuple(t for t in writes if t),
        code=patch_added_text(heredoc_patch) if heredoc_patch else None,
        native=native,
    )


def classify(tool: str, args: dict[str, Any], *, native: bool = True) -> Action:
    """The action a call of ``tool`` with ``args`` makes."""
    path = _first_path(args)
    code: str | None
    old: str | None
    if tool in _SHELL_TOOLS:
        raw = args.get("command", args.get("cmd"))
        if isinstance(raw, list) and len(raw) == 2 and raw[0] == "apply_patch" and isinstance(raw[1], str):
            # Codex CLI's older form: apply_patch run through the shell tool as argv.
            return Action(tool, PATCH, args, paths=patch_paths(raw[1]), code=patch_added_text(raw[1]))
        command = shell_command(raw)
        if command is not None:
            return shell_action(tool, args, command, native)
    if tool in _EDITOR_TOOLS and not args.get("command"):
        # An editor without sub-commands (``edit_file(path, old_string, new_string)``, Cursor's
        # ``edit_file(target_file, code_edit)``): read from its arguments.
        return _fallback(tool, args, path, native)
    if tool in _EDITOR_TOOLS:
        sub = str(args.get("command") or "").split(" ", 1)[0]
        if sub in _EDITOR_WRITES:
            code = _text(args.get("file_text")) or _text(args.get("content")) or ""
            return Action(tool, WRITE, args, path=path, code=code, native=native)
        if sub in _EDITOR_EDITS:
            code = _text(args.get("new_str")) or _text(args.get("text"))
            return Action(
                tool, EDIT, args, path=path, code=code, old=_text(args.get("old_str")), native=native
            )
        return Action(tool, READ, args, path=path, native=native)
    if tool in _PATCH_TOOLS or tool.endswith("apply_patch"):
        patch = _text(args.get("input")) or _text(args.get("patch")) or _text(args.get("diff")) or ""
        return Action(tool, PATCH, args, path=path, paths=patch_paths(patch), code=patch_added_text(patch))
    if tool in _WRITE_TOOLS:
        code = _text(args.get("content")) or _text(args.get("file_text")) or _text(args.get("contents"))
        return Action(tool, WRITE, args, path=path, code=code, native=native)
    if tool in _SWE_EDIT_TOOLS:
        # SWE-agent's function-calling edits of the open file (no path when it is the open one).
        code = next(
            (
                _text(args[k])
                for k in ("replacement_text", "replace", "new_str", "text")
                if _text(args.get(k))
            ),
            None,
        )
        old = _text(args.get("search"))
        return Action(tool, EDIT, args, path=path, code=code, old=old, native=native)
    if tool in _EDIT_TOOLS:
        edits = args.get("edits")
        if isinstance(edits, list):
            pairs = [e for e in edits if isinstance(e, dict)]
            code = "\n".join(str(e.get("new_string") or "") for e in pairs)
            old = "\n".join(str(e.get("old_string") or "") for e in pairs)
            return Action(tool, EDIT, args, path=path, code=code, old=old, native=native)
        code = _text(args.get("new_string")) or _text(args.get("new_source")) or _text(args.get("replace"))
        old = _text(args.get("old_string")) or _text(args.get("search"))
        return Action(tool, EDIT, args, path=path, code=code, old=old, native=native)
    if tool in _READ_TOOLS:
        return Action(tool, READ, args, path=path, native=native)
    if tool in _SEARCH_TOOLS:
        return Action(tool, SEARCH, args, path=path, native=native)
    if tool in _PLAN_TOOLS:
        items = args.get("task_list", args.get("todos", args.get("plan")))
        return Action(tool, PLAN, args, plan=_plan(items, ("title", "content", "step", "description")))
    if tool in _FINISH_TOOLS:
        return Action(tool, FINISH, args, native=native)
    if tool in _THINK_TOOLS:
        return Action(tool, THINK, args, native=native)
    return _fallback(tool, args, path, native)


def _fallback(tool: str, args: dict[str, Any], path: str | None, native: bool) -> Action:
    """An unknown tool, read from its arguments: a patch, an edit, a write, a command, a path."""
    for value in args.values():
        if isinstance(value, str) and is_patch(value):
            return Action(
                tool, PATCH, args, path=path, paths=patch_paths(value), code=patch_added_text(value)
            )
    for new_key, old_key in (
        ("new_string", "old_string"),
        ("new_str", "old_str"),
        ("replace", "search"),
        ("code_edit", "old_string"),
    ):
        if isinstance(args.get(new_key), str) and path:
            return Action(
                tool, EDIT, args, path=path, code=args[new_key], old=_text(args.get(old_key)), native=native
            )
    for key in ("content", "file_text", "contents"):
        if isinstance(args.get(key), str) and path:
            return Action(tool, WRITE, args, path=path, code=args[key], native=native)
    sub = args.get("command")
    if path and isinstance(sub, str) and sub in _EDITOR_READS | _EDITOR_EDITS | _EDITOR_WRITES:
        return classify("str_replace_editor", args, native=native)._replace_tool(tool)
    for key in _COMMAND_KEYS:
        command = shell_command(args.get(key))
        if command:
            return shell_action(tool, args, command, native)
    if path:
        return Action(tool, READ, args, path=path, native=native)
    return Action(tool, OTHER, args, native=native)
