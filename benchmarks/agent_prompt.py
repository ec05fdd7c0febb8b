"""The fixed part of every benchmark body: an OpenHands-style system prompt, the
``execute_bash`` and ``str_replace_editor`` tool schemas and the task (``bodies.py`` grows the
history after them)."""

from __future__ import annotations

from typing import Any

REPO = "/workspace/tidetime"

SYSTEM_PROMPT = f"""You are OpenHands agent, an AI software engineer working in a sandboxed Linux machine.

<ROLE>
You solve programming tasks by running commands and editing files. Be careful and thorough:
a correct small change is worth more than a fast large one. When the user only asks a question,
answer it; do not change code unless asked to.
</ROLE>

<WORKSPACE>
* The repository is checked out at {REPO}. Paths the user gives may be relative to it.
* Edit files in place; never create a copy of a file under another name to work around an edit.
* Prefer `grep -rn`, `find` and `git` with filters over reading whole directories.
* Combine related shell commands with `&&` so that one action does as much as it safely can.
</WORKSPACE>

<CODE_QUALITY>
* Keep changes minimal and focused on the task; match the style of the surrounding code.
* Do not add comments that repeat what the code says.
* Keep imports at the top of files, sorted the way the project sorts them.
</CODE_QUALITY>

<WORKFLOW>
1. Explore: find the code involved and read it before changing it.
2. Reproduce: write or run a test that shows the problem.
3. Fix: make the smallest change that solves the problem.
4. Verify: run the relevant tests, then the wider test suite, and look at the diff.
</WORKFLOW>

<VERSION_CONTROL>
* Do not commit, push or rewrite history unless the user asks for it.
* Never use `git add -A` blindly: check `git status` first.
</VERSION_CONTROL>

<TROUBLESHOOTING>
* When several attempts have failed, stop and list the possible causes, rank them, and test the
  most likely one first. Explain your reasoning before the next change.
* When a command hangs, interrupt it and run it again with a timeout or in the background.
</TROUBLESHOOTING>

<ENVIRONMENT_SETUP>
* If a dependency is missing, install it with the project's own tooling (`pip install -e .`,
  `poetry install`, `npm ci`) rather than installing packages one by one.
* When the user asks you to run an application and it fails, fix the environment first, then
  the application, and tell the user what you changed and why.
* Do not upgrade or downgrade packages that the project pins unless the task requires it.
</ENVIRONMENT_SETUP>

<TESTING>
* Run the narrowest set of tests that covers your change first (`pytest tests/test_x.py -k name`),
  then the whole suite before you finish.
* When a test fails for a reason unrelated to your change, say so instead of changing the test.
* Never delete or weaken an existing test to make it pass.
</TESTING>

<SECURITY>
* Only use credentials the user gave you, only for the task, and never print them.
* Do not send data from the workspace to hosts the user did not name.
</SECURITY>

<PROCESS_MANAGEMENT>
* Stop only processes you started, by their process id; never use broad patterns such as
  `pkill -f python`, which can stop the user's own programs.
* Before starting a server, check whether one is already listening on the port.
</PROCESS_MANAGEMENT>

<COMMUNICATION>
* When you finish, summarize what you changed, where, and how you verified it, in a few lines.
* If the task is ambiguous, state the assumption you made instead of asking many questions.
</COMMUNICATION>"""


def _param(kind: str, description: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "description": description, **extra}


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": required}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


TOOLS: list[dict[str, Any]] = [
    _tool(
        "execute_bash",
        "Run a bash command in a persistent shell session.\n"
        "* One command per call; chain commands with `&&` or `;`.\n"
        "* The shell keeps its working directory, environment and virtualenv between calls.\n"
        "* Long-running commands: run them in the background and redirect their output,"
        " e.g. `python app.py > server.log 2>&1 &`.\n"
        "* A command that produces no output for 30 seconds returns early; send empty"
        " input to read more, text to answer a prompt, or C-c to interrupt it.\n"
        "* Output longer than 30000 characters is truncated in the middle.",
        {
            "command": _param("string", "The bash command to run."),
            "is_input": _param(
                "string", "`true` sends the command as input to the running process.", enum=["true", "false"]
            ),
            "timeout": _param("number", "Optional hard timeout in seconds."),
        },
        ["command"],
    ),
    _tool(
        "str_replace_editor",
        "View, create and edit files.\n"
        "* State is kept across calls.\n"
        "* `view` on a file shows it like `cat -n`; on a directory, lists two levels.\n"
        "* `create` fails if the path already exists.\n"
        "* `str_replace`: `old_str` must match one or more consecutive lines exactly,"
        " whitespace included, and must be unique in the file; include enough context.\n"
        "* `insert` adds `new_str` after line `insert_line`.\n"
        "* `undo_edit` reverts the last edit of the file.",
        {
            "command": _param(
                "string", "The command to run.", enum=["view", "create", "str_replace", "insert", "undo_edit"]
            ),
            "path": _param("string", "Absolute path of a file or directory."),
            "file_text": _param("string", "Content of the file to create."),
            "old_str": _param("string", "Exact text to replace."),
            "new_str": _param("string", "Replacement or inserted text."),
            "insert_line": _param("integer", "Line after which to insert."),
            "view_range": _param(
                "array",
                "Optional [start, end] lines to view; end -1 means to the end.",
                items={"type": "integer"},
            ),
        },
        ["command", "path"],
    ),
]

TASK = f"""<uploaded_files>
{REPO}
</uploaded_files>
I've uploaded a Python repository in {REPO}. Consider the following issue:

<issue_description>
Negative ISO 8601 durations lose their sign

`tidetime.parse_duration("-P1DT2H")` returns `timedelta(days=1, hours=2)` instead of
`-timedelta(days=1, hours=2)`. Formatting round-trips are broken as well:
`format_duration(parse_duration("-PT30M"))` gives `"PT30M"`. Fractional seconds with a comma
(`"PT1,5S"`) are also rejected although ISO 8601 allows them.
</issue_description>

Make the minimal changes to non-test files so that the issue is resolved. Tests are already
taken care of, but run them to verify your change."""
