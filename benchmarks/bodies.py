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

from agent_prompt import REPO, SYSTEM_PROMPT, TASK, TOOLS  # noqa: E402

from policies.tokens import TokenCounter  # noqa: E402

MODEL = "gpt-4o"
SIZES: dict[str, int] = {"2k": 2_000, "30k": 30_000, "120k": 120_000}
SIZED_SEED = 7
SESSION_SEED = 11  # another session than the sized bodies: the proxy has not seen its history

Message = dict[str, Any]

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
