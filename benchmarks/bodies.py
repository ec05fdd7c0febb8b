"""Deterministic coding-agent chat requests for the overhead benchmark.

A proxy's cost depends on what it parses and counts, so the bodies look like what a coding
agent really sends: an OpenHands-style system prompt, the ``execute_bash`` and
``str_replace_editor`` tool schemas, a task, then assistant tool calls (arguments as JSON
strings) alternating with large tool results: pytest logs, numbered file views, grep hits,
git diffs. Every history ends on a tool result: it is the request for the agent's next step.

Sizes are exact prompt tokens as the proxy counts them (``policies.tokens``), and the
generator is seeded, so every machine builds byte-identical bodies.

    python benchmarks/bodies.py --out-dir /tmp/bodies     # body_{2k,30k,120k}.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from policies.tokens import TokenCounter  # noqa: E402

MODEL = "gpt-4o"
SIZES: dict[str, int] = {"2k": 2_000, "30k": 30_000, "120k": 120_000}
SIZED_SEED = 7
SESSION_SEED = 11  # another session than the sized bodies: the proxy has not seen its history
REPO = "/workspace/tidetime"

Message = dict[str, Any]

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

MODULES = ["parsing", "durations", "formatting", "tz", "calendar", "compat", "errors", "intervals"]
NOUNS = ["value", "text", "match", "parts", "sign", "unit", "amount", "result", "offset", "token"]
VERBS = ["parse", "split", "normalize", "format", "validate", "coerce", "scale", "combine", "render"]
UNITS = ["years", "months", "weeks", "days", "hours", "minutes", "seconds", "microseconds"]


class Writer:
    """Seeded text generators for tool outputs; the same seed gives the same session."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def name(self) -> str:
        return f"{self.rng.choice(VERBS)}_{self.rng.choice(NOUNS)}"

    def module(self) -> str:
        return self.rng.choice(MODULES)

    def code_line(self, depth: int) -> str:
        r, n = self.rng, self.name
        templates = [
            f"{r.choice(NOUNS)} = {n()}({r.choice(NOUNS)}, {r.choice(UNITS)}={r.randint(0, 60)})",
            f"if {r.choice(NOUNS)} is None:",
            f"return {r.choice(NOUNS)} * {r.choice(['-1', 'sign', 'factor'])}",
            f"{r.choice(NOUNS)}[{r.choice(UNITS)!r}] = float({r.choice(NOUNS)}.replace(',', '.'))",
            f"raise ParseError(f'invalid {r.choice(UNITS)} in {{{r.choice(NOUNS)}!r}}')",
            f"for {r.choice(NOUNS)} in {r.choice(NOUNS)}.groupdict().values():",
            f"# {r.choice(UNITS)} are {r.choice(['normalized', 'carried over', 'validated'])} here",
            f"{r.choice(NOUNS)} = _DURATION_RE.fullmatch({r.choice(NOUNS)}.strip())",
        ]
        return "    " * depth + r.choice(templates)

    def source(self, lines: int) -> list[str]:
        """Python-looking source: functions with docstrings and indented bodies."""
        out: list[str] = []
        while len(out) < lines:
            out += ["", "", f"def {self.name()}({self.rng.choice(NOUNS)}: str) -> timedelta:"]
            out.append(
                f'    """{self.rng.choice(VERBS).capitalize()} an ISO 8601 {self.rng.choice(NOUNS)}."""'
            )
            out += [self.code_line(self.rng.randint(1, 3)) for _ in range(self.rng.randint(4, 14))]
        return out[:lines]

    def file_view(self, path: str, start: int, count: int) -> str:
        body = "\n".join(f"{start + i:6}\t{line}" for i, line in enumerate(self.source(count)))
        return f"Here's the result of running `cat -n` on {path}:\n{body}\n"

    def grep(self, pattern: str) -> str:
        hits = []
        for _ in range(self.rng.randint(8, 45)):
            folder = self.rng.choice(["tidetime", "tests"])
            path = f"{folder}/{'test_' if folder == 'tests' else ''}{self.module()}.py"
            hits.append(f"{path}:{self.rng.randint(1, 900)}:{self.code_line(self.rng.randint(0, 2))}")
        return "\n".join(sorted(hits))

    def pytest(self, target: str) -> str:
        total = self.rng.randint(30, 260)
        failed = self.rng.randint(0, 4)
        out = [
            "============================= test session starts ==============================",
            "platform linux -- Python 3.11.9, pytest-8.3.3, pluggy-1.5.0",
            f"rootdir: {REPO}",
            "configfile: pyproject.toml",
            "plugins: hypothesis-6.112.1, cov-5.0.0",
            f"collected {total} items",
            "",
        ]
        for module in sorted({self.module() for _ in range(self.rng.randint(2, 6))}):
            marks = "".join(self.rng.choice("......F") if failed else "." for _ in range(total // 4))
            out.append(f"tests/test_{module}.py {marks} [{self.rng.randint(5, 100):3}%]")
        out += ["", "=================================== FAILURES ===================================", ""]
        for index in range(failed):
            test = f"test_{self.name()}_{index}"
            out.append(f"____________________________ {test} _____________________________")
            out.append("")
            out += [self.code_line(1) for _ in range(self.rng.randint(6, 16))]
            text = self.rng.choice(["-P1DT2H", "-PT30M", "PT1,5S"])
            expected = f"timedelta(days=-{self.rng.randint(1, 9)}, seconds={self.rng.randint(0, 86399)})"
            out += [f">       assert parse_duration({text!r}) == {expected}", "E       AssertionError", ""]
            out.append(f"tests/test_{self.module()}.py:{self.rng.randint(10, 400)}: AssertionError")
        out.append("=========================== short test summary info ============================")
        seconds = self.rng.uniform(0.4, 9)
        out.append(f"{'=' * 20} {failed} failed, {total - failed} passed in {seconds:.2f}s {'=' * 20}")
        return "\n".join(out) + f"\n\n[Command `{target}` finished with exit code {1 if failed else 0}.]"

    def diff(self) -> str:
        out: list[str] = []
        for module in sorted({self.module() for _ in range(self.rng.randint(1, 3))}):
            out += [f"diff --git a/tidetime/{module}.py b/tidetime/{module}.py"]
            out += [f"index {self.rng.getrandbits(28):07x}..{self.rng.getrandbits(28):07x} 100644"]
            out += [f"--- a/tidetime/{module}.py", f"+++ b/tidetime/{module}.py"]
            for _ in range(self.rng.randint(1, 4)):
                line = self.rng.randint(10, 600)
                out.append(f"@@ -{line},12 +{line},14 @@ def {self.name()}(value: str) -> timedelta:")
                for _ in range(self.rng.randint(8, 24)):
                    out.append(self.rng.choice(" + - ") + self.code_line(self.rng.randint(1, 2)))
        return "\n".join(out)

    def listing(self) -> str:
        files = [f"./tidetime/{m}.py" for m in MODULES] + [f"./tests/test_{m}.py" for m in MODULES]
        files += [f"./docs/{m}.rst" for m in MODULES] + ["./pyproject.toml", "./README.rst", "./CHANGES.rst"]
        return "\n".join(sorted(files))


def _call(writer: Writer, tool: str, arguments: dict[str, Any], thought: str) -> Message:
    call_id = f"toolu_{writer.rng.getrandbits(64):016x}"
    function = {"name": tool, "arguments": json.dumps(arguments)}
    return {
        "role": "assistant",
        "content": thought,
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


def _result(call: Message, output: str) -> Message:
    call_id, name = call["tool_calls"][0]["id"], call["tool_calls"][0]["function"]["name"]
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": output}


def _bash_output(text: str) -> str:
    return f"{text}\n[The command completed with exit code 0.]\n[Current working directory: {REPO}]"


def next_step(writer: Writer, index: int) -> tuple[Message, Message]:
    """One agent step: an assistant tool call and its result. The first two steps explore."""
    rng = writer.rng
    kind = (
        ["find", "grep"][index] if index < 2 else rng.choice(["view"] * 4 + ["grep", "pytest"] * 2 + ["diff"])
    )
    if kind == "find":
        command = f"cd {REPO} && find . -name '*.py' -o -name '*.rst' -o -name '*.toml' | sort"
        call = _call(writer, "execute_bash", {"command": command}, "Let me look at the repository layout.")
        return call, _result(call, _bash_output(writer.listing()))
    if kind == "grep":
        pattern = rng.choice(["parse_duration", "_DURATION_RE", "format_duration", "sign", "ParseError"])
        command = f"cd {REPO} && grep -rn '{pattern}' tidetime/ tests/"
        call = _call(writer, "execute_bash", {"command": command}, f"Searching for `{pattern}`.")
        return call, _result(call, _bash_output(writer.grep(pattern)))
    if kind == "view":
        path = f"{REPO}/tidetime/{writer.module()}.py"
        start = rng.randint(1, 400)
        count = rng.randint(40, 220)
        arguments = {"command": "view", "path": path, "view_range": [start, start + count - 1]}
        call = _call(writer, "str_replace_editor", arguments, "")
        return call, _result(call, writer.file_view(path, start, count))
    if kind == "pytest":
        command = f"cd {REPO} && python -m pytest tests/ -x -q -p no:cacheprovider 2>&1 | tail -n 200"
        call = _call(writer, "execute_bash", {"command": command, "timeout": 300}, "Running the tests.")
        return call, _result(call, writer.pytest(command))
    call = _call(
        writer, "execute_bash", {"command": f"cd {REPO} && git diff"}, "Reviewing my changes so far."
    )
    return call, _result(call, _bash_output(writer.diff()))


def _body(messages: list[Message]) -> dict[str, Any]:
    # "stream" is the last key: the fake upstream finds it with a backward byte search.
    return {"model": MODEL, "messages": messages, "tools": TOOLS, "stream": False}


def grow_session(seed: int, max_tokens: int) -> list[tuple[int, dict[str, Any]]]:
    """``(tokens, body)`` for each request of one agent session, each one step longer than
    the last, up to ``max_tokens``. Counting is incremental (the counter caches texts)."""
    writer = Writer(seed)
    counter = TokenCounter()
    messages: list[Message] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": TASK},
    ]
    out: list[tuple[int, dict[str, Any]]] = []
    for index in range(10_000):  # bounded: each step adds at least a few hundred tokens
        messages = [*messages, *next_step(writer, index)]
        body = _body(messages)
        tokens = counter.count_request(body).total
        if tokens > max_tokens:
            break
        out.append((tokens, body))
    return out


def session_bodies(max_tokens: int = 120_000) -> list[dict[str, Any]]:
    """The requests of a growing session, from about 2k to ``max_tokens`` prompt tokens
    (``grow_session(SESSION_SEED, max_tokens)`` gives their token counts too)."""
    return [body for _, body in grow_session(SESSION_SEED, max_tokens)]


def sized_bodies(sizes: dict[str, int] | None = None) -> dict[str, tuple[int, dict[str, Any]]]:
    """``{label: (tokens, body)}``: for each size, the session prefix closest to it."""
    sizes = sizes or SIZES
    session = grow_session(SIZED_SEED, int(max(sizes.values()) * 1.1))
    return {label: min(session, key=lambda item: abs(item[0] - target)) for label, target in sizes.items()}


def encode(body: dict[str, Any], stream: bool = False) -> bytes:
    """The bytes a client sends: compact JSON, UTF-8."""
    return json.dumps({**body, "stream": stream}, ensure_ascii=False, separators=(",", ":")).encode()


def parse_size(label: str) -> int:
    """``"2k"`` -> 2000, ``"120k"`` -> 120000, ``"1500"`` -> 1500."""
    label = label.strip().lower()
    return int(float(label[:-1]) * 1000) if label.endswith("k") else int(label)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--sizes", default="2k,30k,120k")
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    labels = [s.strip() for s in args.sizes.split(",") if s.strip()]
    for label, (tokens, body) in sized_bodies({label: parse_size(label) for label in labels}).items():
        path = args.out_dir / f"body_{label}.json"
        path.write_bytes(encode(body))
        print(f"{path}: {tokens} tokens, {path.stat().st_size} bytes, {len(body['messages'])} messages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
