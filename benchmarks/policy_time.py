"""Policy time per request on a session-shaped run, in process (no HTTP).

Each request is one step longer than the last, from about 2k to 120k tokens, as an agent
sends them; the session checkpoint is carried from one request to the next exactly as the
proxy does. Reports, per policy and token band, p50/p99 of the policy's time per request,
split into steady-state requests and compaction points, and the cold time of a 120k history
seen for the first time.

    .venv/bin/python benchmarks/policy_time.py --policies full,improved,sre,n_latest_20
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bodies

from policies.digests import Digests
from policies.pipeline import Checkpoint, Policy, build_policies
from policies.prompt_cache import PromptCache
from policies.tokens import TokenCounter
from proxy.config.settings import Settings, policy_specs

BANDS = ((0, 30_000), (30_000, 60_000), (60_000, 90_000), (90_000, 130_000))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run_session(
    policy: Policy, session: list[dict[str, Any]], window: int, cache: PromptCache | None = None
) -> list[dict[str, Any]]:
    counter = TokenCounter()
    counter.warm_up()
    digests = Digests()
    checkpoint: Checkpoint | None = None
    rows = []
    for body in session:
        started = time.perf_counter()
        # The proxy's counter for one request (a memo of the messages it counted, by identity).
        outcome = await policy.apply(
            body, counter.for_request(), window=window, checkpoint=checkpoint, digests=digests, cache=cache
        )
        elapsed = (time.perf_counter() - started) * 1000
        compacted = outcome.checkpoint.compactions > (checkpoint.compactions if checkpoint else 0)
        checkpoint = outcome.checkpoint
        rows.append(
            {
                "ms": elapsed,
                "before": outcome.tokens_before,
                "after": outcome.tokens_after,
                "compaction": compacted,
            }
        )
    return rows


async def cold(policy: Policy, body: dict[str, Any], window: int, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        counter = TokenCounter()
        counter.warm_up()
        started = time.perf_counter()
        await policy.apply(body, counter, window=window, digests=Digests())
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--policies", default="full,improved,sre,n_latest_20")
    parser.add_argument("--window", type=int, default=128_000, help="context window given to the policies")
    parser.add_argument("--max-tokens", type=int, default=120_000)
    parser.add_argument(
        "--warm-cache",
        action="store_true",
        help="the proxy's view of a warm prompt cache (gpt-4o prices): rewrites that pay run",
    )
    args = parser.parse_args()
    policies = build_policies(policy_specs(Settings()))
    session = bodies.session_bodies(max_tokens=args.max_tokens)
    print(f"session: {len(session)} requests, window {args.window:,} tokens\n")
    print("| policy | band (k tokens) | requests | steady p50 ms | steady p99 ms | compactions | max ms |")
    print("|---|---|---:|---:|---:|---:|---:|")
    summary = []
    for name in args.policies.split(","):
        policy = policies[name]
        cache = PromptCache(idle_seconds=20.0, ttl_seconds=300.0) if args.warm_cache else None
        rows = asyncio.run(run_session(policy, session, args.window, cache))
        for low, high in BANDS:
            band = [r for r in rows if low <= r["before"] < high]
            if not band:
                continue
            steady = [r["ms"] for r in band if not r["compaction"]] or [0.0]
            compactions = [r["ms"] for r in band if r["compaction"]]
            print(
                f"| {name} | {low // 1000}-{high // 1000} | {len(band)} | {percentile(steady, 0.5):.3f} | "
                f"{percentile(steady, 0.99):.3f} | {len(compactions)} | "
                f"{max(compactions) if compactions else 0:.1f} |"
            )
        reduction = 1 - sum(r["after"] for r in rows) / sum(r["before"] for r in rows)
        cold_ms = asyncio.run(cold(policy, session[-1], args.window))
        summary.append((name, reduction, cold_ms))
    print("\n| policy | token reduction over the session | cold ms, last (largest) request |")
    print("|---|---:|---:|")
    for name, reduction, cold_ms in summary:
        print(f"| {name} | {reduction:.1%} | {cold_ms:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
