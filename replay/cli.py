"""``compaction-proxy replay ...``: download, run, merge, rescore, report, demo.

Exit codes of ``run``/``demo``/``merge``: 0 all good; 1 protocol violations, failed requests
or a failed worker; 3 a gated arm failed the release gate; 2 bad arguments, configuration, or
run directories that cannot be merged; 130 stopped (SIGINT or SIGTERM; saved parts are kept).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import orjson

from replay.cli_tools import add_tool_commands, inject_command, tune_command
from replay.config import ModelEndpoint, ReplayConfig, ReplayConfigError, load_replay_config
from replay.download import add_download_arguments, run_download_command
from replay.report.gate import evaluate_gate
from replay.report.report import console_table, report_html, summary_markdown
from replay.report.results import write_json
from replay.report.run_results import grade, results_of_run
from replay.session.doors import DIALECTS

DEMO_WINDOW = 16_000
# The model demo's cases are ~2-5k tokens: a 3k window makes the compacting arm compact.
MODEL_DEMO_WINDOW = 3_000


def add_replay_commands(subparsers: Any) -> None:
    replay = subparsers.add_parser("replay", help="replay recorded trajectories through the proxy")
    commands = replay.add_subparsers(dest="replay_command", required=True)

    run = commands.add_parser("run", help="replay cases through every arm and report")
    run.add_argument("--input", required=True, type=Path, help="trajectories as JSON lines (row shape)")
    run.add_argument("--out", required=True, type=Path, help="run directory (resumed if it exists)")
    run.add_argument(
        "--shard",
        metavar="K/N",
        help="replay only the K-th of N slices of the cases (usable case i, counted in input order "
        "after --limit, is in slice i mod N + 1: the same slice on every machine); the run "
        "directory holds that slice's parts and a manifest; combine the slices with `replay merge` "
        "(a slice's own results skip the release gate)",
    )
    _run_options(run)

    merge = commands.add_parser(
        "merge",
        help="combine the run directories of --shard runs into one run",
        description="Check that the runs' manifests agree (input SHA-256, --limit, arms, replay "
        "settings, policies, proxy configuration) and that their shards are disjoint, link or copy "
        "their parts into --out, and write results.json, summary.md and report.html as one run "
        "over all of them would. Missing shards give a warning and results of the shards present.",
    )
    merge.add_argument("--out", required=True, type=Path, help="the merged run directory")
    merge.add_argument(
        "runs", nargs="+", type=Path, metavar="DIR", help="run directories of replay run --shard"
    )
    merge.add_argument(
        "--input", type=Path, help="the input file, where it is not at the path the manifests name"
    )

    demo = commands.add_parser("demo", help="the bundled handful of trajectories through all arms, offline")
    demo.add_argument("--out", type=Path, default=Path("replay-demo"), help="run directory")
    _run_options(demo)

    rescore = commands.add_parser("rescore", help="re-judge stored answers with a common judge")
    rescore.add_argument(
        "--run", dest="run_dir", required=True, type=Path, help="a run directory holding results.json"
    )
    rescore.add_argument("--judge-url", help="judge endpoint (OpenAI-compatible base URL)")
    rescore.add_argument("--judge-model", help="judge model name")
    rescore.add_argument("--judge-key-env", help="environment variable holding the judge's key")
    rescore.add_argument("--replay-config", type=Path, help="take the judge from this replay config")

    report = commands.add_parser("report", help="rewrite summary.md and report.html from results.json")
    report.add_argument("--run", dest="run_dir", required=True, type=Path, help="a run directory")

    download = commands.add_parser(
        "download", help="download rows of the pinned dataset revision (resumable)"
    )
    add_download_arguments(download)
    add_tool_commands(commands)


def _run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arms", help="comma-separated policy names (default: the replay config's)")
    parser.add_argument("--limit", type=int, help="use the first N usable cases")
    parser.add_argument(
        "--context-window",
        type=int,
        help="force this window (tokens) on every request (policies compared at a tight window)",
    )
    parser.add_argument("--proxy-url", help="use this running proxy instead of starting one")
    parser.add_argument(
        "--upstream-port",
        type=int,
        default=0,
        help="port of the recorded upstream (with --proxy-url: where that proxy forwards)",
    )
    parser.add_argument("--config", type=Path, help="the proxy configuration whose policies are the arms")
    parser.add_argument("--replay-config", type=Path, help="replay settings: models, gate (YAML)")
    parser.add_argument("--mode", choices=["enforce", "shadow"], help="how the steps are sent")
    parser.add_argument(
        "--dialect",
        choices=DIALECTS,
        help="the door the steps go through (default chat)",
    )
    parser.add_argument("--concurrency", type=int, help="cases replayed at once (per worker with --jobs)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="replay in N worker processes, each with its own recorded upstream and proxy (config, "
        "log and state in DIR/worker-<n>/); every (arm, case) is replayed whole by one worker, so "
        "the results are those of --jobs 1. Worth it with cores to spare: a --jobs 1 run already "
        "keeps about 1.5 cores busy (its Python and its proxy), and each worker costs about 1.5 "
        "CPU-seconds to start. Not with --proxy-url (default 1)",
    )
    parser.add_argument("--admin-token-env", help="env var holding the proxy's admin token (--proxy-url)")
    parser.add_argument("--answer-url", help="answering model endpoint (OpenAI-compatible base URL)")
    parser.add_argument("--answer-model", help="answering model name")
    parser.add_argument("--answer-key-env", help="environment variable holding its key")
    parser.add_argument("--judge-url", help="judge endpoint (default: the answering model's)")
    parser.add_argument("--judge-model", help="judge model name (default: the answering model)")
    parser.add_argument("--judge-key-env", help="environment variable holding the judge's key")
    parser.add_argument("--repeats", type=int, help="answering runs per arm (model arms)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def register(subparsers: Any) -> None:
    """``compaction-proxy replay ...``: registered by the proxy's CLI when the command is used."""
    add_replay_commands(subparsers)
    subparsers.choices["replay"].set_defaults(run=run_command)


def run_command(args: argparse.Namespace) -> int:
    command = args.replay_command
    try:
        if command in ("run", "demo"):
            return _run(args, demo=command == "demo")
        if command == "merge":
            return _merge(args)
        if command == "rescore":
            return _rescore(args)
        if command == "report":
            return _report(args.run_dir)
        if command == "download":
            return _download(args)
        if command == "inject":
            return inject_command(args)
        if command == "tune":
            return tune_command(args)
    except ReplayConfigError as error:
        print(f"replay: {error}", file=sys.stderr)
        return 2
    raise AssertionError(command)


def demo_input(name: str = "demo.jsonl") -> Path:
    return Path(str(resources.files("replay.data").joinpath(name)))


def _run(args: argparse.Namespace, demo: bool) -> int:
    import os

    from replay.run.run import RunOptions, WorkerFailed, run_replay
    from replay.run.shards import Shard

    overrides: dict[str, Any] = {
        "arms": tuple(a.strip() for a in args.arms.split(",") if a.strip()) if args.arms else None,
        "context_window": args.context_window,
        "mode": args.mode,
        "dialect": args.dialect,
        "concurrency": args.concurrency,
    }
    model_demo = demo and bool(args.answer_url)
    if args.answer_url:
        if not args.answer_model:
            raise ReplayConfigError("--answer-url needs --answer-model")
        answer = {"base_url": args.answer_url, "model": args.answer_model, "api_key_env": args.answer_key_env}
        overrides["answer_model"] = answer
        overrides["judge_model"] = {
            "base_url": args.judge_url or args.answer_url,
            "model": args.judge_model or args.answer_model,
            "api_key_env": args.judge_key_env if args.judge_url else args.answer_key_env,
        }
    overrides["repeats"] = args.repeats
    if demo and args.context_window is None:
        overrides["context_window"] = MODEL_DEMO_WINDOW if model_demo else DEMO_WINDOW
    if model_demo:
        # A few questions, so that a small local model gets through them in minutes.
        overrides["arms"] = overrides["arms"] or ("full", "improved")
        overrides["repeats"] = args.repeats or 1
    config = load_replay_config(args.replay_config, overrides)
    admin_token = os.environ.get(args.admin_token_env) if args.admin_token_env else None
    try:
        shard = Shard.parse(args.shard) if getattr(args, "shard", None) else None
    except ValueError as error:
        print(f"replay: {error}", file=sys.stderr)
        return 2
    options = RunOptions(
        input=demo_input("model-demo.jsonl" if model_demo else "demo.jsonl") if demo else args.input,
        out=args.out,
        config=config,
        proxy_config=args.config,
        proxy_url=args.proxy_url,
        limit=args.limit,
        progress=not args.no_progress,
        admin_token=admin_token,
        upstream_port=args.upstream_port,
        jobs=args.jobs,
        shard=shard,
    )
    if not options.input.exists():
        print(f"replay: no such input file: {options.input}", file=sys.stderr)
        return 2
    try:
        raw = asyncio.run(run_replay(options))
    except ValueError as error:
        print(f"replay: {error}", file=sys.stderr)
        return 2
    except WorkerFailed as error:
        print(f"replay: {error}\n(the parts saved so far are kept: run again to resume)", file=sys.stderr)
        return 1
    except (asyncio.CancelledError, KeyboardInterrupt):
        print("replay: stopped (the parts saved so far are kept: run again to resume)", file=sys.stderr)
        return 130
    results = results_of_run(config, raw, options.input)
    if shard is not None and not shard.complete:
        results["run"]["shard"] = shard.label
        return _finish(results, options.out, config, with_gate=False)
    return _finish(results, options.out, config)


def _merge(args: argparse.Namespace) -> int:
    from replay.run.merge import MergeError, merge_runs
    from replay.run.shards import ManifestError

    try:
        merged = merge_runs(args.runs, args.out, input_path=args.input)
    except (MergeError, ManifestError) as error:
        print(f"replay merge: {error}", file=sys.stderr)
        return 2
    for warning in merged.warnings:
        print(f"replay merge: warning: {warning}", file=sys.stderr)
    results = results_of_run(merged.config, merged.raw, merged.input_path)
    if not merged.shard.complete:
        results["run"]["shard"] = merged.shard.label
        return _finish(results, args.out, merged.config, with_gate=False)
    return _finish(results, args.out, merged.config)


def _finish(results: dict[str, Any], out: Path, config: ReplayConfig | None, with_gate: bool = True) -> int:
    """Write the results and the reports; the exit code. ``with_gate``: evaluate the release gate
    (not on the results of some shards only)."""
    gate_config = config.gate if config is not None and with_gate else None
    if gate_config is not None:
        results["gate"] = evaluate_gate(gate_config, results["arms"])
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", results)
    (out / "summary.md").write_text(summary_markdown(results))
    (out / "report.html").write_text(report_html(results))
    print(console_table(results))
    print(f"\nwrote {out / 'results.json'}, {out / 'summary.md'}, {out / 'report.html'}")
    violations = {a: f["protocol_violations"] for a, f in results["arms"].items() if f["protocol_violations"]}
    errors = {a: f["errors"] for a, f in results["arms"].items() if f["errors"]}
    code = 0
    if violations:
        print(f"PROTOCOL VIOLATIONS: {violations}", file=sys.stderr)
        code = 1
    if errors:
        print(f"FAILED REQUESTS: {errors} (see results.json and the proxy log)", file=sys.stderr)
        code = 1
    gate = results.get("gate")
    if gate:
        print(f"\nrelease gate: {'PASSED' if gate['passed'] else 'FAILED'}")
        for arm, verdict in gate["verdicts"].items():
            detail = "pass" if verdict["passed"] else "FAIL: " + "; ".join(verdict["failures"])
            print(f"  {arm}: {detail}")
        if not gate["passed"] and code == 0:
            code = 3
    return code


def _rescore(args: argparse.Namespace) -> int:
    path = args.run_dir / "results.json"
    results = orjson.loads(path.read_bytes())
    judge: ModelEndpoint | None = None
    config: ReplayConfig | None = None
    if args.replay_config:
        config = load_replay_config(args.replay_config)
        judge = config.judge_model
    if args.judge_url and args.judge_model:
        judge = ModelEndpoint(base_url=args.judge_url, model=args.judge_model, api_key_env=args.judge_key_env)
    if judge is None:
        print(
            "replay rescore: give --judge-url and --judge-model, or a replay config with judge_model",
            file=sys.stderr,
        )
        return 2
    if not any(q.get("answers") for q in results["questions"]):
        print(
            "replay rescore: this run holds no answers (it ran without an answering model)", file=sys.stderr
        )
        return 2
    asyncio.run(grade(results, judge))
    if config is None:
        config = load_replay_config(None, dict(results["run"]["config"]))
    return _finish(results, args.run_dir, config)


def _report(run: Path) -> int:
    results = orjson.loads((run / "results.json").read_bytes())
    (run / "summary.md").write_text(summary_markdown(results))
    (run / "report.html").write_text(report_html(results))
    print(console_table(results))
    return 0


def _download(args: argparse.Namespace) -> int:
    return run_download_command(args)
