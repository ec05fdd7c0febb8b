"""The coding-agent session ``compaction-proxy demo`` plays: its system prompt, task and tools,
the tool calls the stand-in model makes in order, and what each call prints.

Both sides read this script: the stand-in model (``stand_in_model.py``) takes its next call
from it, and the demo's agent loop (``demo.py``) answers each call with the output written here,
the way a real agent would run the command. Everything is generated, deterministic and local:
no file is read and nothing is run. The outputs have the sizes real ones have (a test run with
tracebacks is a few thousand tokens, a source file one or two thousand), so that the history
grows past the window the way a real session's does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

SYSTEM_PROMPT = (
    "You are a coding agent working in a Python repository. Use the tools to inspect files, run "
    "commands and edit code. Keep changes minimal, run the tests after each change, and finish "
    "with a short report once the whole test suite passes."
)
TASK = (
    "Invoices with many lines are off by a cent: `total_with_tax` in src/invoice/totals.py rounds "
    "each line's tax before summing, so tests/test_totals.py::test_many_lines fails. Fix the "
    "rounding (round once, half-up, at the invoice level) and make sure the whole suite passes."
)
FINAL_ANSWER = (
    "Done. `total_with_tax` now sums unrounded line taxes and rounds once, half-up, at the "
    "invoice level (src/invoice/totals.py); `Money.round_half_up` is used by tax.py and "
    "totals.py alike. The whole suite passes: 246 passed."
)


def _function(name: str, arguments: str, **properties: str) -> dict[str, Any]:
    schema = {key: {"type": "string", "description": text} for key, text in properties.items()}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": arguments,
            "parameters": {"type": "object", "properties": schema, "required": list(properties)},
        },
    }


TOOLS = [
    _function("shell", "Run a shell command in the repository; returns its output.", command="the command"),
    _function("read_file", "Return a file of the repository with line numbers.", path="the file's path"),
    _function(
        "edit_file",
        "Replace one exact occurrence of old with new in a file.",
        path="the file's path",
        old_string="the text to replace",
        new_string="its replacement",
    ),
]

MODULES = ("totals", "tax", "money", "lines", "currency", "discounts", "rates", "export", "ledger")


def source_file(module: str, functions: int = 14) -> str:
    """A plausible module of the invoicing package, numbered like ``cat -n``."""
    lines = [
        f'"""invoice.{module}: part of the invoicing package."""',
        "",
        "from __future__ import annotations",
        "",
        "from decimal import ROUND_HALF_UP, Decimal",
        "",
        "from invoice.money import Money",
        "",
        "CENT = Decimal('0.01')",
        "",
    ]
    for n in range(functions):
        name = f"{module}_{('amount', 'share', 'rate', 'line', 'total', 'split', 'net')[n % 7]}_{n}"
        lines += [
            "",
            f"def {name}(amount: Money, quantity: int, rate: Decimal) -> Money:",
            f'    """The {module} figure {n} of a line: amount times quantity at the given rate."""',
            "    if quantity < 0:",
            f'        raise ValueError(f"{name}: negative quantity {{quantity}}")',
            "    gross = amount.value * quantity",
            "    taxed = gross * (1 + rate)",
            f"    return Money(taxed.quantize(CENT, rounding=ROUND_HALF_UP), amount.currency)  # {n}",
            "",
        ]
    return "\n".join(f"{i:5d}\t{line}" for i, line in enumerate(lines, 1))


def pytest_output(failing: tuple[str, ...], passed: int) -> str:
    """pytest -q's output: progress, each failure with its traceback, the summary."""
    total = passed + len(failing)
    lines = [
        "============================= test session starts ==============================",
        "platform linux -- Python 3.11.9, pytest-8.3.3, pluggy-1.5.0",
        "rootdir: /work/invoicing",
        "configfile: pyproject.toml",
        f"collected {total} items",
        "",
    ]
    failed_at = {7 + 53 * n for n in range(len(failing))}
    for start in range(0, total, 60):
        dots = "".join("F" if start + i in failed_at else "." for i in range(min(60, total - start)))
        lines.append(f"{dots} [{min(100, (start + 60) * 100 // total):3d}%]")
    if failing:
        lines += ["", "=================================== FAILURES ==================================="]
    for test in failing:
        name = test.rpartition("::")[2]
        lines += [f"________________________________ {test} ________________________________", ""]
        lines += [
            f"    def {name}():",
            "        invoice = make_invoice(lines=41, rates=RATES, seed=1234)",
            "        expected = Money(sum(line.gross for line in invoice.lines) * Decimal('1.19'))",
            ">       assert total_with_tax(invoice) == expected.round_half_up()",
            "",
        ]
        for depth in range(6):
            lines += [
                f"src/invoice/totals.py:{40 + depth * 9}: in total_with_tax",
                f"    taxes = [line_tax(line, rates[line.kind]) for line in invoice.lines]  # frame {depth}",
                f"src/invoice/tax.py:{22 + depth}: in line_tax",
                "    return Money(raw.quantize(Decimal('0.01'), rounding=ROUND_HALF_UP), line.currency)",
            ]
        lines += [
            "E       AssertionError: assert Money('1234.57', 'EUR') == Money('1234.56', 'EUR')",
            "E        +  where Money('1234.57', 'EUR') = total_with_tax(Invoice(lines=[...41 items]))",
            "",
        ]
    if failing:
        lines.append("=========================== short test summary info ============================")
    lines += [f"FAILED {test} - AssertionError: assert Money('1234.57'...)" for test in failing]
    verdict = f"{len(failing)} failed, {passed} passed" if failing else f"{passed} passed"
    lines.append(f"======================== {verdict} in {1.2 + total / 100:.2f}s ========================")
    return "\n".join(lines)


def grep_output(pattern: str, hits: int) -> str:
    return "\n".join(
        f"src/invoice/{MODULES[n % len(MODULES)]}.py:{17 + n * 7}:        value = {pattern}amount * rate, 2)"
        for n in range(hits)
    )


def listing() -> str:
    """``git status --short && ls -R src tests``: a clean tree and the package's files."""
    files = [f"{module}.py" for module in MODULES]
    tests = [f"test_{module}.py" for module in MODULES]
    return "\n".join(["src:", "invoice", "", "src/invoice:", "__init__.py", *files, "", "tests:", *tests])


def diff_stat() -> str:
    changed = ("tax", "totals", "export", "money", "lines", "discounts")
    rows = [
        f" src/invoice/{module}.py | {4 + 3 * n:2d} {'+' * (2 + n)}{'-' * (2 + n)}"
        for n, module in enumerate(changed)
    ]
    return "\n".join([*rows, f" {len(changed)} files changed, 61 insertions(+), 42 deletions(-)"])


def git_log(entries: int) -> str:
    return "\n".join(
        f"{(0x9F3A21 + n * 7919) & 0xFFFFFF:06x} invoice: "
        + ("round per line for the tax report", "add currency table", "split discounts by kind")[n % 3]
        + f" (#{412 - n})"
        for n in range(entries)
    )


FAILING = (
    "tests/test_totals.py::test_many_lines",
    "tests/test_totals.py::test_mixed_rates",
    "tests/test_export.py::test_pdf_totals_match",
)


@dataclass(frozen=True)
class Step:
    """One call the model makes: why (its text), which tool, the arguments; and what it prints."""

    thought: str
    tool: str
    arguments: dict[str, str]
    output: str

    def arguments_json(self) -> str:
        return orjson.dumps(self.arguments).decode()


def _read(module: str, why: str, functions: int = 14) -> Step:
    path = f"src/invoice/{module}.py"
    return Step(why, "read_file", {"path": path}, source_file(module, functions))


def _shell(why: str, command: str, output: str, exit_code: int = 0) -> Step:
    # The agent's shell tool ends each output with the exit code, as most harnesses do.
    return Step(why, "shell", {"command": command}, f"{output}\n[exit code: {exit_code}]")


def _pytest(why: str, target: str, failing: tuple[str, ...], passed: int) -> Step:
    command = f"python -m pytest -q {target}".strip()
    return _shell(why, command, pytest_output(failing, passed), 1 if failing else 0)


def _edit(module: str, old: str, new: str) -> Step:
    path = f"src/invoice/{module}.py"
    arguments = {"path": path, "old_string": old, "new_string": new}
    return Step(f"Edit {path}.", "edit_file", arguments, f"Edited {path}: 1 change.")


def build_script() -> list[Step]:
    """The session's calls in order (about fifty; the model's read of a saved output comes on top)."""
    steps = [
        _shell("Look at the repository first.", "git status --short && ls -R src tests", listing()),
        _pytest("Run the whole suite to see what fails.", "", FAILING, 243),
        _read("totals", "Read the function named in the task."),
        _shell("Find every place that rounds.", "grep -rn 'round(' src", grep_output("round(", 40)),
        _read("tax", "line_tax is in the traceback; read it."),
        _read("money", "See how Money rounds."),
        _pytest("Run the totals tests alone, verbose.", "tests/test_totals.py -vv", FAILING[:2], 38),
        _read("lines", "How are invoice lines built?"),
        _shell("When was per-line rounding added?", "git log --oneline -30 -- src/invoice", git_log(30)),
        _read("currency", "Check currency handling for exponents."),
        _pytest("The tax tests, to know what must not change.", "tests/test_tax.py", (), 61),
        _read("discounts", "Discounts are applied before tax; read them."),
        _read("rates", "Which rates feed line_tax?"),
        _shell(
            "Where is total_with_tax called?",
            "grep -rn 'total_with_tax' src tests",
            grep_output("total(", 24),
        ),
        _read("export", "The PDF export failure: read export.py."),
        _pytest("The export tests.", "tests/test_export.py", FAILING[2:], 29),
        _edit("tax", "def line_tax(line, rate):", "def line_tax(line, rate, *, rounded=True):"),
        _edit("totals", "taxes = [line_tax(", "taxes = [line_tax(rounded=False, line="),
        _pytest("Run the totals tests after the change.", "tests/test_totals.py", FAILING[1:2], 39),
        _read("totals", "Re-read totals.py after the edit."),
        _read("ledger", "Mixed rates still fail; ledger.py groups lines by rate."),
        _shell(
            "Compare with the ledger grouping.", "grep -rn 'group_by_rate' src", grep_output("group(", 18)
        ),
        _edit("totals", "for rate, group in groups:", "for rate, group in sorted(groups):"),
        _pytest("Run the totals tests again.", "tests/test_totals.py", (), 40),
        _pytest("Now the export tests.", "tests/test_export.py", FAILING[2:], 29),
        _read("export", "Export still rounds per line; read it again."),
        _edit("export", "round_line(total)", "total.round_half_up()"),
        _pytest("The export tests after the change.", "tests/test_export.py", (), 30),
        _read("money", "Make round_half_up the one rounding helper."),
        _edit("money", "def round(self):", "def round_half_up(self) -> Money:"),
        _shell(
            "Find the callers of the old name.", "grep -rn '\\.round()' src tests", grep_output(".round(", 22)
        ),
        _edit("tax", ".round()", ".round_half_up()"),
        _edit("lines", ".round()", ".round_half_up()"),
        _edit("discounts", ".round()", ".round_half_up()"),
        _pytest("The whole suite after the rename.", "", FAILING[2:], 245),
        _read("export", "One export test still fails; read the helper once more."),
        _edit("export", "Money.round(", "Money.round_half_up("),
        _pytest("The whole suite again.", "", (), 246),
        _shell("Lint the package.", "ruff check src tests", "All checks passed!"),
        _shell("Type-check it.", "mypy src", "Success: no issues found in 11 source files"),
        _shell("Review the diff.", "git diff --stat", diff_stat()),
        _read("totals", "A last read of totals.py before finishing."),
        _read("tax", "And of tax.py."),
        _pytest("The final full run.", "", (), 246),
    ]
    return steps


SCRIPT = build_script()
