"""What the tight-windows agent sends besides the model's calls: its fixed prompt (system prompt
and tool schemas) sized to a number of tokens, its task, and the output of each step's command,
sized so that a step (the call and its output) is about a given number of tokens.

The fixed prompt is ``agent_prompt.py``'s OpenHands-style system prompt and tools plus three
more OpenHands tools (``think``, ``finish``, ``task_tracker``), padded with a seeded repository
guide in the system prompt (or the system prompt cut by lines when the target is smaller). Each
step's command and output are chosen from the step number and a seed (``bodies.Writer``): a
file listing, grep hits, a ``cat -n`` view, a verbose pytest log, a git diff. Everything is
deterministic: the same arguments give the same bytes on every machine.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent_prompt import REPO, SYSTEM_PROMPT, TASK, TOOLS, _param, _tool
from bodies import MODULES, NOUNS, UNITS, VERBS, Writer

from policies.tokens import TokenCounter

Message = dict[str, Any]

EXTRA_TOOLS: list[dict[str, Any]] = [
    _tool(
        "think",
        "Use the tool to think about something. It will not obtain new information or change the"
        " repository, but just log the thought. Use it when complex reasoning or brainstorming is"
        " needed: listing possible causes of a bug, comparing fixes, planning a refactor.",
        {"thought": _param("string", "The thought to log.")},
        ["thought"],
    ),
    _tool(
        "finish",
        "Signals the completion of the current task or conversation. Use it when you have"
        " successfully completed the task, or cannot proceed further; include a summary of what"
        " you did and what the user should check.",
        {"message": _param("string", "Final message to send to the user.")},
        ["message"],
    ),
    _tool(
        "task_tracker",
        "Keep a structured list of the task's steps. `view` shows the list; `plan` replaces it:"
        " each item has an id, a title, a status (todo, in_progress, done) and optional notes."
        " Keep exactly one item in progress; mark items done as soon as they are.",
        {
            "command": _param("string", "view or plan.", enum=["view", "plan"]),
            "task_list": _param(
                "array",
                "The full list of items (plan only).",
                items={
                    "type": "object",
                    "properties": {
                        "id": {"type": "string"},
                        "title": {"type": "string"},
                        "status": {"type": "string", "enum": ["todo", "in_progress", "done"]},
                        "notes": {"type": "string"},
                    },
                    "required": ["id", "title", "status"],
                },
            ),
        },
        ["command"],
    ),
]

KINDS = ["view"] * 4 + ["grep", "pytest"] * 2 + ["diff"]
FOOTER = ["[The command completed with exit code 0.]", f"[Current working directory: {REPO}]"]


def largest_fitting(count: Callable[[int], int], high: int, limit: int) -> int:
    """The largest ``k`` in ``0..high`` with ``count(k) <= limit`` (``count`` grows with k)."""
    low = 0
    while low < high:
        middle = (low + high + 1) // 2
        if count(middle) <= limit:
            low = middle
        else:
            high = middle - 1
    return low


def _guide_lines(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(count):
        module, verb, noun = rng.choice(MODULES), rng.choice(VERBS), rng.choice(NOUNS)
        lines.append(
            f"* `tidetime/{module}.py:{rng.randint(10, 900)}` `{verb}_{noun}()` {verb}s the {noun} of "
            f"{rng.choice(UNITS)}; callers in tests/test_{rng.choice(MODULES)}.py expect "
            f"{rng.choice(['a timedelta', 'a string', 'None on error', 'a ParseError'])}."
        )
    return lines


def fixed_prompt(counter: TokenCounter, model: str, target: int, seed: int = 5) -> tuple[str, list[Any]]:
    """A system prompt and tool schemas whose prompt tokens (a request of the system message
    and the tools alone) are at most ``target``, as close to it as whole lines allow."""
    tools = [*TOOLS, *EXTRA_TOOLS]

    def tokens(system: str) -> int:
        body = {"model": model, "messages": [{"role": "system", "content": system}], "tools": tools}
        return counter.count_request(body).total

    if tokens(SYSTEM_PROMPT) > target:
        lines = SYSTEM_PROMPT.splitlines()
        kept = largest_fitting(lambda k: tokens("\n".join(lines[:k])), len(lines), target)
        return "\n".join(lines[:kept]), tools
    guide = _guide_lines(seed, max(8, (target - tokens(SYSTEM_PROMPT)) // 20))

    def padded(k: int) -> str:
        return SYSTEM_PROMPT + "\n\n<REPOSITORY_GUIDE>\n" + "\n".join(guide[:k]) + "\n</REPOSITORY_GUIDE>"

    return padded(largest_fitting(lambda k: tokens(padded(k)), len(guide), target)), tools


def opening(system: str) -> list[Message]:
    """The first two messages of every request: the system prompt and the task."""
    return [{"role": "system", "content": system}, {"role": "user", "content": TASK}]


@dataclass(frozen=True)
class StepPlan:
    """The command of each step and its output's parts: head and tail lines kept whole, body
    lines cut to size."""

    seed: int = 13

    def _writer(self, step: int) -> Writer:
        return Writer(self.seed * 100_003 + step)

    def kind(self, step: int) -> str:
        if step <= 2:
            return ["find", "grep"][step - 1]
        return random.Random(self.seed * 7_919 + step).choice(KINDS)

    def command(self, step: int) -> str:
        rng = random.Random(self.seed * 31 + step)
        kind = self.kind(step)
        if kind == "find":
            return f"cd {REPO} && find . -type f -not -path './.git/*' | sort"
        if kind == "grep":
            pattern = rng.choice(["parse_duration", "_DURATION_RE", "format_duration", "sign", "ParseError"])
            return f"cd {REPO} && grep -rn '{pattern}' tidetime/ tests/"
        if kind == "view":
            start = rng.randint(1, 400)
            return f"cd {REPO} && cat -n tidetime/{rng.choice(MODULES)}.py | sed -n '{start},{start + 399}p'"
        if kind == "pytest":
            return f"cd {REPO} && python -m pytest tests/ -v -p no:cacheprovider 2>&1 | tail -n 600"
        return f"cd {REPO} && git diff"

    def parts(self, step: int, lines: int) -> tuple[list[str], list[str], list[str]]:
        """(head, body, tail) of step ``step``'s output, with at least ``lines`` body lines."""
        writer, kind = self._writer(step), self.kind(step)
        if kind == "find":
            files = {f"./tidetime/{writer.module()}/{writer.name()}.py" for _ in range(lines * 2)}
            files |= {f"./tests/test_{writer.module()}_{writer.rng.choice(NOUNS)}.py" for _ in range(lines)}
            return [], sorted(files)[: max(lines, 1)], FOOTER
        if kind == "grep":
            body = sorted(writer.grep("x").splitlines() + writer.grep("y").splitlines())
            while len(body) < lines:
                body += sorted(writer.grep("z").splitlines())
            return [], body, FOOTER
        if kind == "view":
            start = int(self.command(step).split("sed -n '")[1].split(",")[0])
            return [], [f"{start + i:6}\t{text}" for i, text in enumerate(writer.source(lines))], FOOTER
        if kind == "pytest":
            return _pytest(writer, lines)
        body = []
        while len(body) < lines:
            body += writer.diff().splitlines()
        return [], body, FOOTER

    def output(self, step: int, counter: TokenCounter, model: str, call_id: str, limit: int) -> str:
        """Step ``step``'s output: as many body lines as keep its tool message within ``limit``
        tokens."""
        encoding = counter.encoding_for(model)

        def tokens(text: str) -> int:
            return counter.count_message({"role": "tool", "tool_call_id": call_id, "content": text}, encoding)

        lines = max(16, limit // 8)
        head, body, tail = self.parts(step, lines)
        while tokens("\n".join(head + body + tail)) <= limit and len(body) < 50 * lines:
            lines *= 2
            head, body, tail = self.parts(step, lines)
        kept = largest_fitting(lambda k: tokens("\n".join(head + body[:k] + tail)), len(body), limit)
        return "\n".join(head + body[:kept] + tail)


def _pytest(writer: Writer, lines: int) -> tuple[list[str], list[str], list[str]]:
    """A verbose pytest log: one line per test, two failures, the summary."""
    rng = writer.rng
    tests = [f"tests/test_{writer.module()}.py::test_{writer.name()}_{n}" for n in range(lines)]
    head = [
        "============================= test session starts ==============================",
        "platform linux -- Python 3.11.9, pytest-8.3.3, pluggy-1.5.0 -- /usr/bin/python3",
        f"rootdir: {REPO}",
        "configfile: pyproject.toml",
        f"collected {len(tests)} items",
        "",
    ]
    body = [
        f"{name} {'FAILED' if n % 37 == 5 else 'PASSED'} [{100 * (n + 1) // len(tests):3}%]"
        for n, name in enumerate(tests)
    ]
    tail = ["", "=================================== FAILURES ===================================", ""]
    for index in range(2):
        tail.append(
            f"____________________________ test_{writer.name()}_{index} _____________________________"
        )
        tail += [writer.code_line(1) for _ in range(rng.randint(4, 9))]
        text = rng.choice(["-P1DT2H", "-PT30M", "PT1,5S"])
        tail += [f">       assert parse_duration({text!r}) == -timedelta(hours=2)", "E       AssertionError"]
        tail.append(f"tests/test_{writer.module()}.py:{rng.randint(10, 400)}: AssertionError")
    tail.append("=========================== short test summary info ============================")
    tail.append(f"{'=' * 20} 2 failed, {len(tests) - 2} passed in {rng.uniform(0.4, 9):.2f}s {'=' * 20}")
    return head, body, [*tail, "", "[The command completed with exit code 1.]"]
