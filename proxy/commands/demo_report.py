"""What ``compaction-proxy demo`` prints: the requests where the proxy compacted (their
``x-compaction-*`` headers), its events as a table, the model's read of a saved output, what
the model received last, and the same history sent without the proxy. Plain aligned text that
reads the same piped (bold headings only on a terminal), or one JSON object (``--json``)."""

from __future__ import annotations

import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from proxy.commands.stand_in_model import ReadBack

WIDTH = 100
SESSION = "demo"


@dataclass(frozen=True)
class RequestRow:
    """One request of the agent through the proxy: its number, status and x-compaction-* headers."""

    number: int
    status: int
    headers: dict[str, str]

    @property
    def eventful(self) -> bool:
        """The proxy rewrote the view (a compaction point) or answered reads of saved outputs."""
        return (
            "x-compaction-trigger" in self.headers or self.headers.get("x-compaction-read-rounds", "0") != "0"
        )


@dataclass(frozen=True)
class Outcome:
    model: str
    window: int
    stand_in: str
    proxy: str
    proxy_pid: int
    config: Path
    state_dir: Path
    keep: bool
    rows: list[RequestRow]
    events: list[dict[str, Any]]
    reads: list[ReadBack]
    last_messages: list[Any]
    agent_messages: list[dict[str, Any]]
    overflow_status: int
    overflow: dict[str, Any]
    seconds: dict[str, float]

    def ui_link(self) -> str:
        sessions = [e["session"] for e in self.events if isinstance(e.get("session"), str)]
        return f"{self.proxy}/ui" + (f"#session={sessions[-1]}" if sessions else "")

    def points(self) -> list[dict[str, Any]]:
        """The events where something happened: a compaction point, or reads answered."""
        return [e for e in self.events if e.get("trigger") or _reads(e)]

    def total(self, side: str) -> int:
        """Prompt tokens over the session, as the agent sent them (``before``) or upstream (``after``)."""
        return sum(int(r.headers.get(f"x-compaction-tokens-{side}", 0)) for r in self.rows)

    def largest_sent(self) -> int:
        return max((int(r.headers.get("x-compaction-tokens-before", 0)) for r in self.rows), default=0)


def _reads(event: dict[str, Any]) -> int:
    record = event.get("read_tool_output")
    return len(record.get("reads") or []) if isinstance(record, dict) else 0


def _clip(text: str, width: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 3] + "..."


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


class _Style:
    def __init__(self, color: bool) -> None:
        self.color = color

    def bold(self, text: str) -> str:
        return f"\x1b[1m{text}\x1b[0m" if self.color else text

    def dim(self, text: str) -> str:
        return f"\x1b[2m{text}\x1b[0m" if self.color else text


def render_text(outcome: Outcome, *, color: bool = False) -> str:
    style = _Style(color)
    out: list[str] = []
    for part in (_setup, _headers, _event_table, _read_back, _last_view, _overflow, _closing):
        out += part(outcome, style)
    return "\n".join(out) + "\n"


def _setup(outcome: Outcome, style: _Style) -> list[str]:
    s = outcome.seconds
    steps = sum(1 for m in outcome.agent_messages if m.get("role") == "tool")
    largest = outcome.largest_sent()
    window = f"{outcome.window:,}"
    ready = f"{s['proxy_ready']:.1f} s"
    return [
        style.bold(
            "compaction-proxy demo: a scripted coding-agent session through a real proxy, no key needed"
        ),
        "",
        f"  model   {outcome.model}, a stand-in this command serves at {outcome.stand_in}:",
        f"          scripted, local, window {window} tokens (past it: OpenAI's 400 context_length_exceeded)",
        f"  proxy   compaction-proxy serve at {outcome.proxy}, pid {outcome.proxy_pid}, ready in {ready}:",
        "          the built-in default policy (improved) and mode (enforce)",
        f"  config  {outcome.config}, written for the demo: a models entry gives",
        f"          {outcome.model} (a name the built-in table does not know) its {window}-token window",
        "",
        f"The agent made {steps} tool calls in {len(outcome.rows)} requests ({s['session']:.1f} s); "
        f"its history grew to {largest:,} tokens,",
        f"{largest / outcome.window:.1f} x the window. In all it sent {outcome.total('before'):,} prompt "
        f"tokens; the proxy sent {outcome.total('after'):,} upstream.",
        "",
    ]


# The headers that change from one compacted request to the next, in the order they tell it.
_VARYING = (
    "x-compaction-trigger",
    "x-compaction-tokens-before",
    "x-compaction-tokens-after",
    "x-compaction-read-rounds",
)


def _headers(outcome: Outcome, style: _Style) -> list[str]:
    eventful = [row for row in outcome.rows if row.eventful]
    if not eventful:
        return [style.bold("No request was compacted."), ""]
    first, rest = eventful[0], eventful[1:]
    out = [
        style.bold(
            f"Requests the proxy compacted or answered reads for: {len(eventful)} of {len(outcome.rows)}"
        ),
        f"  request {first.number}, HTTP {first.status}, its x-compaction-* response headers:",
        *(f"    {name}: {first.headers[name]}" for name in _ordered(first.headers)),
    ]
    if rest:
        head = ("request", *(name.removeprefix("x-compaction-") for name in _VARYING))
        rows = [(str(row.number), *(row.headers.get(name, "-") for name in _VARYING)) for row in rest]
        out += [
            "  the others (the same headers; these are the ones that change):",
            *_table(head, rows, indent=4),
        ]
    return [*out, ""]


def _ordered(headers: dict[str, str]) -> list[str]:
    return [*(n for n in _VARYING if n in headers), *sorted(n for n in headers if n not in _VARYING)]


def _table(
    head: tuple[str, ...], rows: Sequence[tuple[str, ...]], *, indent: int = 2, left: int = 0
) -> list[str]:
    """Columns sized to their widest cell; the first ``left`` columns flush left, the rest right
    (numbers line up)."""
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]

    def line(cells: tuple[str, ...]) -> str:
        padded = (
            c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )
        return " " * indent + "  ".join(padded).rstrip()

    return [line(head), *(line(row) for row in rows)]


def _event_table(outcome: Outcome, style: _Style) -> list[str]:
    points = outcome.points()
    head = ("time", "trigger", "request", "tokens before -> after", "handles saved", "reads")
    rows = [
        (
            time.strftime("%H:%M:%S", time.localtime(e["time"])) + f".{int(e['time'] * 1000) % 1000:03d}",
            str(e.get("trigger") or "-"),
            str(e.get("request") or "-"),
            f"{e.get('tokens_before', 0):,} -> {e.get('tokens_after', 0):,}",
            str(len(e.get("handles_offloaded") or [])),
            str(_reads(e) or "-"),
        )
        for e in points
    ]
    others = len(outcome.events) - len(points)
    return [
        style.bold(f"Compaction events, from GET /v1/compaction/events?session={SESSION}:"),
        *_table(head, rows, left=2),
        style.dim(f"  ({others} more events: requests under the trigger, sent as they came, and requests"),
        style.dim("  between points, the last point's decisions re-applied and the new messages appended)"),
        "",
    ]


def _read_back(outcome: Outcome, style: _Style) -> list[str]:
    if not outcome.reads:
        return []
    read = outcome.reads[0]
    lines = read.result.splitlines()
    # The result's headings and matches; its context lines are left out here.
    shown = [line for line in lines if line.startswith(("Searched", "handle=")) or "FAILED" in line]
    return [
        style.bold(
            "The model searched its saved outputs (answered by the proxy; the agent never saw the call):"
        ),
        f"  read_tool_output({orjson.dumps(read.arguments).decode()})",
        *(f"  | {_clip(line, WIDTH - 4)}" for line in shown),
        style.dim(f"  ({len(lines)} lines in the answer; its context lines are left out here)"),
        "",
    ]


def _last_view(outcome: Outcome, style: _Style) -> list[str]:
    """The messages the model received last: the head and the summary (its state ledger
    outlined), then the verbatim tail with its placeholders."""
    messages = outcome.last_messages
    sent = len(outcome.agent_messages) - 1  # the last request came before the final answer
    last = outcome.rows[-1].headers if outcome.rows else {}
    tokens = [int(last.get(f"x-compaction-tokens-{side}", 0)) for side in ("after", "before")]
    title = (
        f"What the model received last: {len(messages)} messages, {tokens[0]:,} tokens "
        f"(the agent sent {sent}, {tokens[1]:,} tokens):"
    )
    out = [style.bold(title)]
    summary = next((i for i, m in enumerate(messages) if _text(m.get("content")).startswith("[Summary")), -1)
    for message in messages[: summary + 1] if summary >= 0 else messages[:3]:
        text = _text(message.get("content"))
        if text.startswith("[Summary"):
            out += [f"  {'user':<9} {text.splitlines()[0]}", *_ledger_outline(text)]
        else:
            out.append(f"  {message.get('role')!s:<9} {_clip(text, WIDTH - 12)}")
    tail = messages[summary + 1 :] if summary >= 0 else messages[3:]
    placeholders = [m for m in tail if _text(m.get("content")).startswith("[Output saved outside")]
    saved = len(placeholders)
    out.append(
        f"  then the {len(tail)} newest messages as the agent sent them, but {saved} outputs saved elsewhere:"
    )
    for message in placeholders[:2]:
        head, _, description = _text(message.get("content")).partition("\n")
        out += [f"  {'tool':<9} {head}", f"  {'':<9} {_clip(description.splitlines()[0], WIDTH - 12)}"]
    return [*out, ""]


def _ledger_outline(summary: str) -> list[str]:
    """The summary's state ledger, a line per section: its heading, first entry and count."""
    out: list[str] = []
    sections: list[tuple[str, list[str]]] = []
    for line in summary.splitlines()[1:]:
        if line.startswith("### "):
            sections.append((line[4:], []))
        elif sections and line.strip():
            sections[-1][1].append(line.removeprefix("- "))
        elif line.strip():
            out.append(f"  {'':<9} {_clip(line, WIDTH - 12)}")
    for heading, entries in sections:
        more = f" (+{len(entries) - 1} more)" if len(entries) > 1 else ""
        first = entries[0] if entries else ""
        out.append(f"  {'':<9}   {_clip(f'{heading}: {first}', WIDTH - 14 - len(more))}{more}")
    return out


def _overflow(outcome: Outcome, style: _Style) -> list[str]:
    error = outcome.overflow.get("error") or {}
    return [
        style.bold("Without the proxy: the agent's last request, sent straight to the stand-in, gets"),
        f"  HTTP {outcome.overflow_status} {error.get('code')}:",
        *textwrap.wrap(str(error.get("message")), WIDTH - 4, initial_indent="  ", subsequent_indent="  "),
        "",
    ]


def _closing(outcome: Outcome, style: _Style) -> list[str]:
    s = outcome.seconds
    out = [f"{style.bold('Session page:')} {outcome.ui_link()}"]
    if outcome.keep:
        out += [
            "  The proxy and the stand-in run until Ctrl-C. Kept after it: config, store and log in",
            f"  {outcome.state_dir}",
            f"  (compaction-proxy events --config {outcome.config} --session {SESSION})",
        ]
    else:
        out.append(
            style.dim("  (this proxy stops with the demo: `compaction-proxy demo --keep` keeps it running)")
        )
    timings = f"proxy ready {s['proxy_ready']:.1f} s, session {s['session']:.1f} s, total {s['total']:.1f} s"
    return [*out, f"Timings: {timings}"]


def render_json(outcome: Outcome) -> str:
    body = {
        "model": outcome.model,
        "window": outcome.window,
        "stand_in_url": outcome.stand_in,
        "proxy_url": outcome.proxy,
        "proxy_pid": outcome.proxy_pid,
        "ui": outcome.ui_link(),
        "config": str(outcome.config),
        "state_dir": str(outcome.state_dir) if outcome.keep else None,
        "requests": len(outcome.rows),
        "largest_request_tokens": outcome.largest_sent(),
        "tokens_sent": outcome.total("before"),
        "tokens_upstream": outcome.total("after"),
        "compacted": [
            {"request": r.number, "status": r.status, "headers": r.headers}
            for r in outcome.rows
            if r.eventful
        ],
        "events": [
            {
                key: e.get(key)
                for key in (
                    "time",
                    "request",
                    "trigger",
                    "tokens_before",
                    "tokens_after",
                    "handles_offloaded",
                    "mechanisms",
                )
            }
            | {"reads": _reads(e)}
            for e in outcome.points()
        ],
        "events_total": len(outcome.events),
        "reads": [{"arguments": r.arguments, "result": r.result} for r in outcome.reads],
        "last_request_messages": len(outcome.last_messages),
        "without_proxy": {"status": outcome.overflow_status, "error": outcome.overflow.get("error")},
        "seconds": {k: round(v, 3) for k, v in outcome.seconds.items()},
    }
    return orjson.dumps(body).decode() + "\n"
