"""Token reduction per policy on recorded trajectories, request by request.

Each trajectory is replayed as its agent sent it (the history before each assistant message
is one request), through every policy, carrying the session checkpoint; the model window can
be forced smaller than the production one so that compaction happens on short histories
(seed 000, section 4.9). Reports per policy and window: requests, protocol violations (must
be 0), mean tokens before and after, reduction (1 - after/before over all requests), compaction
points and summaries. Reduction alone says nothing about what survived: the replay harness
measures that.

    .venv/bin/python benchmarks/policy_reduction.py --input ../shared/data/trajectories.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from policies.conversation import parse, role
from policies.digests import Digests
from policies.pipeline import Checkpoint, Policy, build_policies
from policies.tokens import TokenCounter
from proxy.config.settings import Settings, policy_specs
from replay.recording.rows import iter_rows, row_messages, row_tools


async def replay(
    policy: Policy, rows: list[dict[str, Any]], window: int, counter: TokenCounter
) -> dict[str, Any]:
    totals = {"requests": 0, "violations": 0, "before": 0, "after": 0, "points": 0, "summaries": 0}
    totals |= {"transitions": 0, "stable": 0}
    digests = Digests()
    for row in rows:
        messages, tools = row_messages(row), row_tools(row)
        checkpoint: Checkpoint | None = None
        previous: list[Any] | None = None
        for end in (i for i, m in enumerate(messages) if role(m) == "assistant" and i > 0):
            history = messages[:end]
            body = {"model": "gpt-4o", "messages": history, "tools": tools}
            outcome = await policy.apply(body, counter, window=window, checkpoint=checkpoint, digests=digests)
            view = outcome.messages if outcome.messages is not None else history
            totals["violations"] += len(parse(view).problems)
            totals["requests"] += 1
            totals["before"] += outcome.tokens_before
            totals["after"] += outcome.tokens_after
            totals["points"] += outcome.trigger is not None
            totals["summaries"] += outcome.facts.summary is not None
            if previous is not None and outcome.trigger is None:
                # Between compaction points the prefix the upstream sees must only grow.
                totals["transitions"] += 1
                totals["stable"] += view[: len(previous)] == previous
            previous = view
            checkpoint = outcome.checkpoint
    return totals


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--input", default=str(Path(__file__).resolve().parents[2] / "shared/data/trajectories.jsonl")
    )
    parser.add_argument("--windows", default="128000,32000,16000")
    parser.add_argument("--policies", default="")
    args = parser.parse_args()
    rows = list(iter_rows(args.input))
    policies = build_policies(policy_specs(Settings()))
    names = args.policies.split(",") if args.policies else list(policies)
    counter = TokenCounter()
    print(f"{len(rows)} trajectories from {args.input}\n")
    print(
        "| policy | window | requests | violations | mean before | mean after | reduction | points "
        "| summaries | prefix-stable |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for window in (int(w) for w in args.windows.split(",")):
        for name in names:
            t = asyncio.run(replay(policies[name], rows, window, counter))
            n = max(1, t["requests"])
            reduction = 1 - t["after"] / max(1, t["before"])
            print(
                f"| {name} | {window:,} | {t['requests']} | {t['violations']} | {t['before'] / n:,.0f} | "
                f"{t['after'] / n:,.0f} | {reduction:.1%} | {t['points']} | {t['summaries']} | "
                f"{t['stable'] / max(1, t['transitions']):.1%} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
