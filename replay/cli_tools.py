"""``replay inject`` (the state-contract injection suite) and ``replay tune`` (a policy's knobs
searched on the user's own traces): registered beside the other replay commands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_tool_commands(commands: Any) -> None:
    inject = commands.add_parser(
        "inject",
        help="write trajectories with user turns inserted (constraints, corrections, ...) to replay",
        description="For every input row and position, the row with a user turn of each family "
        "inserted between complete steps (never inside a tool exchange), each stating a unique, "
        "checkable fact; deterministic for --seed. Replay the output with `replay run`: the "
        "state-contract questions check each fact, and the report shows survival by the number "
        "of compaction cycles that passed over it.",
    )
    inject.add_argument("--input", required=True, type=Path, help="trajectories as JSON lines (row shape)")
    inject.add_argument("--output", required=True, type=Path, help="the injected rows (JSON lines)")
    inject.add_argument("--seed", type=int, default=0, help="templates and order are drawn from it")
    inject.add_argument(
        "--families",
        help="comma-separated: constraint, correction, deferred_instruction, approval, decision "
        "(default all)",
    )
    inject.add_argument("--positions", help="comma-separated: early, middle, late (default all)")

    tune = commands.add_parser(
        "tune",
        help="search a policy's knobs on your traces for the lowest effective cost that passes the gate",
        description="Candidates are the base policy with knobs changed (trigger, summary target, "
        "retained tail, offload keep_recent / clear_min_chars / min_tokens), each replayed as an arm "
        "beside full. The winner is the candidate with the lowest effective cost (prompt caching, "
        "summarizer and read rounds included) among those that pass the release gate of the replay "
        "config (default thresholds without one). Writes tune.md, tune.json, frontier.svg and "
        "winner.yml (a config snippet) into --out. Deterministic for --seed; rerun to resume.",
    )
    tune.add_argument("--input", required=True, type=Path, help="trajectories as JSON lines (row shape)")
    tune.add_argument("--out", required=True, type=Path, help="tune directory (resumed if it exists)")
    tune.add_argument("--policy", default="improved", help="the base policy (default improved)")
    tune.add_argument("--trials", type=int, default=12, help="candidates sampled first (default 12)")
    tune.add_argument("--rounds", type=int, default=3, help="one-step refinement rounds (default 3)")
    tune.add_argument("--seed", type=int, default=0)
    tune.add_argument("--config", type=Path, help="the proxy configuration the base policy is in")
    tune.add_argument("--replay-config", type=Path, help="replay settings: gate, prices, cache rule")
    tune.add_argument("--context-window", type=int, help="force this window (tokens) on every request")
    tune.add_argument("--limit", type=int, help="use the first N usable cases")
    tune.add_argument("--jobs", type=int, default=1, help="worker processes per replay")
    tune.add_argument("--no-progress", action="store_true", help="no progress bar")


def _names(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def inject_command(args: argparse.Namespace) -> int:
    from replay.inject.injection import POSITIONS, inject_file
    from replay.inject.templates import FAMILIES

    families = _names(args.families) or list(FAMILIES)
    positions = _names(args.positions) or list(POSITIONS)
    unknown = [f for f in families if f not in FAMILIES] + [p for p in positions if p not in POSITIONS]
    if unknown:
        print(f"replay: unknown families or positions: {', '.join(unknown)}", file=sys.stderr)
        return 2
    if not args.input.exists():
        print(f"replay: no such input file: {args.input}", file=sys.stderr)
        return 2
    summary = inject_file(args.input, args.output, args.seed, families, positions)
    skipped = ", ".join(f"{reason} ({n})" for reason, n in sorted(summary.skipped.items())) or "none"
    print(f"{summary.rows_in} rows in, {summary.rows_out} injected rows written to {args.output}")
    print(f"skipped: {skipped}")
    return 0


def tune_command(args: argparse.Namespace) -> int:
    from replay.tune.run import TuneOptions, run_tune

    if not args.input.exists():
        print(f"replay: no such input file: {args.input}", file=sys.stderr)
        return 2
    options = TuneOptions(
        input=args.input,
        out=args.out,
        base=args.policy,
        trials=args.trials,
        rounds=args.rounds,
        seed=args.seed,
        proxy_config=args.config,
        replay_config=args.replay_config,
        context_window=args.context_window,
        limit=args.limit,
        jobs=args.jobs,
        progress=not args.no_progress,
    )
    try:
        winner = run_tune(options)
    except ValueError as error:
        print(f"replay: {error}", file=sys.stderr)
        return 2
    print((args.out / "tune.md").read_text())
    return 0 if winner is not None else 3
