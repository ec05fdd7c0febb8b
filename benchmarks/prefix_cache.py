"""Prefix-cache payoff on a real model server: a cache-stable policy vs one that rewrites
the prefix on every request.

A recorded trajectory is replayed step by step (the history before each recorded assistant
message is one request, ``max_tokens: 1`` so the time is the prefill) through the proxy into
llama.cpp's server with SmolLM2-135M-Instruct. The server keeps the KV state of its previous
prompt and re-uses the longest common prefix, as hosted prompt caches do: a view that only
grows between compaction points is prefilled incrementally, a view whose start moves on every
request (a sliding window of the N latest messages) is prefilled from scratch every time.
Each policy gets a freshly started server, so no run inherits another's cache.

    .venv/bin/python benchmarks/prefix_cache.py --policies improved,n_latest_10 --window 4000

Needs the model server of the end-to-end suite (see tests/model_server.py).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from processes import Processes, free_port  # noqa: E402

from replay.recording.cases import Case, build_case  # noqa: E402
from replay.recording.rows import iter_rows  # noqa: E402
from tests.model_server import MODEL_ALIAS, ModelServer, unavailable_reason  # noqa: E402


def load(path: Path, instance: str) -> Case:
    for number, row in enumerate(iter_rows(path)):
        if row["instance_id"] == instance:
            case = build_case(row, number)
            assert isinstance(case, Case)
            return case
    raise SystemExit(f"{instance} not in {path}")


_PREFIX_LINE = re.compile(r"Llama\.generate: (\d+) prefix-match hit, remaining (\d+) prompt tokens to eval")


def prefill_counts(log_path: Path, prompt_tokens: list[int]) -> tuple[int, int]:
    """Tokens the server evaluated and tokens it took from its cache, from its log: llama.cpp
    logs the prefix match of every prompt after the first (the first is all new)."""
    matches = [(int(a), int(b)) for a, b in _PREFIX_LINE.findall(log_path.read_text(errors="replace"))]
    if len(matches) == len(prompt_tokens) - 1:
        matches = [(0, prompt_tokens[0]), *matches]
    cached = sum(hit for hit, _ in matches)
    return sum(prompt_tokens) - cached, cached


def run_policy(case: Case, policy: str, window: int, workdir: Path) -> dict[str, Any]:
    model = ModelServer(free_port(), workdir / f"model-{policy}.log").start()
    processes = Processes(workdir)
    try:
        port, _ = processes.start_proxy(
            0,
            {
                "upstream": {"base_url": model.base_url, "timeout": 900},
                "context_windows": {"smollm2*": window, "default": 128000},
                "state_dir": str(workdir / f"state-{policy}"),
            },
        )
        latencies: list[float] = []
        prompt_tokens: list[int] = []
        view_tokens: list[int] = []
        compactions = 0
        with httpx.Client(timeout=900, trust_env=False) as http:
            for index in case.steps:
                body: dict[str, Any] = {
                    "model": MODEL_ALIAS,
                    "messages": list(case.messages[:index]),
                    "max_tokens": 1,
                }
                if case.tools:
                    body["tools"] = list(case.tools)
                started = time.perf_counter()
                response = http.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions",
                    content=orjson.dumps(body),
                    headers={
                        "content-type": "application/json",
                        "x-compaction-policy": policy,
                        "x-session-id": f"bench-{policy}",
                    },
                )
                latencies.append(time.perf_counter() - started)
                if response.status_code != 200:
                    raise SystemExit(
                        f"{policy}: step {index}: HTTP {response.status_code}: {response.text[:300]}"
                    )
                prompt_tokens.append(int(response.json()["usage"]["prompt_tokens"]))
                view_tokens.append(int(response.headers["x-compaction-tokens-after"]))
                compactions += bool(response.headers.get("x-compaction-trigger"))
        prefilled, cached = prefill_counts(model.log_path, prompt_tokens)
        return {
            "policy": policy,
            "tokens_prefilled": prefilled,
            "tokens_from_cache": cached,
            "requests": len(latencies),
            "compaction_points": compactions,
            "prompt_tokens_total": sum(prompt_tokens),
            "seconds_total": sum(latencies),
            "seconds_mean": statistics.fmean(latencies),
            "seconds_p50": statistics.median(latencies),
            "seconds_max": max(latencies),
            "latencies": latencies,
            "view_tokens": view_tokens,
        }
    finally:
        processes.stop_all()
        model.stop()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--input", type=Path, default=HERE.parent / "tests" / "fixtures" / "trajectories_sample.jsonl"
    )
    parser.add_argument("--instance", default="sayanarijit__expandvars-41")
    parser.add_argument("--policies", default="improved,n_latest_10")
    parser.add_argument(
        "--window", type=int, default=4000, help="the proxy's window for the model (its tokens)"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--workdir", type=Path, help="keep the servers' logs and state here")
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason:
        raise SystemExit(reason)
    case = load(args.input, args.instance)
    results = []
    with tempfile.TemporaryDirectory() as directory:
        workdir = args.workdir or Path(directory)
        workdir.mkdir(parents=True, exist_ok=True)
        for policy in args.policies.split(","):
            print(f"{policy}: {len(case.steps)} requests ...", file=sys.stderr, flush=True)
            results.append(run_policy(case, policy, args.window, workdir))
    print(
        f"\n{case.instance_id}, {len(case.steps)} requests, proxy window {args.window} tokens, max_tokens 1\n"
    )
    print(
        "| policy | compaction points | prompt tokens | prefilled | from cache | total s | mean s "
        "| p50 s | max s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['policy']} | {r['compaction_points']} | {r['prompt_tokens_total']:,} "
            f"| {r['tokens_prefilled']:,} | {r['tokens_from_cache']:,} | {r['seconds_total']:.1f} "
            f"| {r['seconds_mean']:.2f} | {r['seconds_p50']:.2f} | {r['seconds_max']:.2f} |"
        )
    print(
        "\nper request (s): "
        + "; ".join(f"{r['policy']}: " + " ".join(f"{x:.1f}" for x in r["latencies"]) for r in results)
    )
    if args.json:
        args.json.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
