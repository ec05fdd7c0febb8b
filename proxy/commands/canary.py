"""``compaction-proxy canary status|resume``: the canary's arms side by side, and lifting a pause.

Both read the store of the configuration (``--config``), as ``events`` does, so they see what
every replica on that store recorded. ``status`` exits 0 (pass), 2 (waiting for sessions) or
3 (breached or paused); ``resume`` lifts the pause and starts a new epoch: the gate judges the
sessions seen from then on, not the ones that tripped it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import orjson

from proxy.canary.runtime import canary_report
from proxy.canary.store import make_canary_book
from proxy.config.settings import Settings
from proxy.state.store import Store

ROWS = (
    ("sessions", "sessions", "{:,.0f}"),
    ("requests per session", "requests_per_session", "{:.2f}"),
    ("prompt tokens", "prompt_tokens", "{:,.0f}"),
    ("cached prompt tokens", "cached_prompt_tokens", "{:,.0f}"),
    ("cache write tokens", "cache_write_tokens", "{:,.0f}"),
    ("output tokens", "output_tokens", "{:,.0f}"),
    ("context-window errors", "context_errors", "{:,.0f}"),
    ("view errors", "errors", "{:,.0f}"),
    ("client errors (not judged)", "client_errors", "{:,.0f}"),
    ("upstream errors (not judged)", "upstream_errors", "{:,.0f}"),
    ("reads per session", "reads_per_session", "{:.2f}"),
    ("re-acquisitions per session", "reacquisitions_per_session", "{:.2f}"),
    ("agent compactions", "agent_compactions", "{:,.0f}"),
    ("compaction's own tokens in", "compaction_input_tokens", "{:,.0f}"),
    ("compaction's own tokens out", "compaction_output_tokens", "{:,.0f}"),
    ("prompt cost per session", "prompt_cost_per_session", "{:,.4f}"),
    ("compaction's own per session", "compaction_cost_per_session", "{:,.4f}"),
    ("cost per session", "cost_per_session", "{:,.4f}"),
)


def render(report: dict[str, Any]) -> str:
    arms = report["arms"]
    lines = [f"canary: share {report['share']:g} treated; verdict {report['verdict']}"]
    if report["paused"]:
        paused = report["paused"]
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(paused["time"]))
        lines.append(f"PAUSED at {when} by {', '.join(paused['reason'])}: new sessions go to the holdout")
    if report.get("damaged") or report.get("unreadable_sessions"):
        damaged = ", ".join(report.get("damaged") or []) or "none"
        lines.append(
            f"DAMAGED book: unreadable {damaged}; {report.get('unreadable_sessions', 0):,} unreadable "
            "sessions left out (an unreadable pause counts as a pause: `canary resume` replaces it)"
        )
    lines += ["", f"{'':30}{'treated':>16}{'holdout':>16}"]
    for label, key, form in ROWS:
        lines.append(
            f"{label:30}{form.format(arms['treated'][key]):>16}{form.format(arms['holdout'][key]):>16}"
        )
    for ending in ("answered", "abandoned", "active"):
        values = [arms[a]["endings"][ending] for a in ("treated", "holdout")]
        lines.append(f"{'sessions ' + ending:30}{values[0]:>16,}{values[1]:>16,}")
    # Cost is the prompt's and the compaction's own, so what is saved is net of the latter.
    lines.append(f"{'saved per session (net)':30}{report['saved_per_session']:>16,.4f}")
    lines.append("")
    if report["verdict"] == "waiting":
        lines.append(f"gate: waiting for {report['min_sessions']} sessions in each arm")
    for check in report["checks"]:
        low, high = check["interval"]
        mark = "BREACH" if check["breached"] else "ok"
        lines.append(
            f"gate {check['check']:28} {check['estimate']:+.4f}  [{low:+.4f}, {high:+.4f}]  "
            f"{check['budget']}  {mark}"
        )
    return "\n".join(lines) + "\n"


def run_canary(args: argparse.Namespace, settings: Settings, store: Store) -> int:
    book = make_canary_book(store)

    async def run() -> int:
        try:
            if args.action == "resume":
                await book.resume(time.time())
                sys.stdout.write(
                    "canary resumed: new sessions get the policy again; a new epoch starts now\n"
                )
                return 0
            report = await canary_report(book, settings.canary, time.time())
            sys.stdout.write(orjson.dumps(report).decode() + "\n" if args.json else render(report))
            if report["paused"] or report["verdict"] == "breach":
                return 3
            return 2 if report["verdict"] == "waiting" else 0
        finally:
            await store.close()

    return asyncio.run(run())
