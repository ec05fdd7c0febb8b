"""Compaction at tight windows, the way a user meets it: a plain agent loop (``tight_agent``)
drives the real proxy (``python -m proxy.cli serve`` with a temporary config) in front of a
fake model that behaves like a real provider (``tests/agent_upstream``: it calls the agent's
tool each step, refuses a prompt over its window with OpenAI's own 400
``context_length_exceeded``, reads saved outputs through the proxy's ``read_tool_output``
every ``--read-every`` steps, and reports ``cached_tokens`` as OpenAI's automatic prefix
caching does).

    .venv/bin/python benchmarks/tight_windows.py                                # 8k and 16k
    .venv/bin/python benchmarks/tight_windows.py --steps 20 --scenarios 8k      # quick, < 1 min

Each (scenario, policy) gets a fresh fake and a fresh proxy. For ``full`` the fake's window is
unbounded: that run's cost is what the same session costs uncompacted, the reference of the
``cost vs full`` columns. Everything runs on 127.0.0.1; the proxy is stopped by its PID at
the end, whatever happens. The Markdown report goes to stdout (``--md-out``), every figure to
``--json-out``. Columns: docs/benchmarks/index.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [p for p in (str(HERE), str(HERE.parent)) if p not in sys.path]

import httpx  # noqa: E402
import orjson  # noqa: E402
from processes import Processes  # noqa: E402
from tight_agent import API_KEY, Agent  # noqa: E402
from tight_measures import measure, relative_costs  # noqa: E402
from tight_prompt import StepPlan, fixed_prompt, opening  # noqa: E402
from tight_report import markdown  # noqa: E402

from policies.tokens import TokenCounter  # noqa: E402
from tests.agent_upstream import AgentUpstream  # noqa: E402
from tests.agent_upstream.prefix_cache import PrefixCache  # noqa: E402

MODEL = "agent-model"
UNBOUNDED = 1 << 30


@dataclass(frozen=True)
class Scenario:
    name: str
    window: int
    fixed_tokens: int  # system prompt + tool schemas
    step_tokens: int  # one step: the model's call and the tool's output
    steps: int


SCENARIOS = {
    "8k": Scenario("8k", 8192, 2700, 1200, 60),
    "16k": Scenario("16k", 16384, round(0.45 * 16384), 1200, 60),
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def proxy_events(port: int, session: str) -> list[dict[str, Any]]:
    """The session's compaction events, from the proxy's events API."""
    response = httpx.get(
        f"http://127.0.0.1:{port}/v1/compaction/events",
        params={"session": session, "limit": 1000},
        headers={"authorization": f"Bearer {API_KEY}"},
        timeout=30,
        trust_env=False,
    )
    response.raise_for_status()
    data: list[dict[str, Any]] = response.json()["data"]
    return data


def run_one(scenario: Scenario, policy: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """One agent session of ``scenario`` through a fresh proxy running ``policy``."""
    counter = TokenCounter()
    system, tools = fixed_prompt(counter, MODEL, scenario.fixed_tokens)
    plan = StepPlan()
    fake = AgentUpstream(
        window=UNBOUNDED if policy == "full" else scenario.window,
        steps=scenario.steps,
        read_every=args.read_every,
        model=MODEL,
        prefix_cache=True,
        cache_horizon=args.cache_horizon,
        step_command=plan.command,
    ).start()
    processes = Processes(workdir)
    session = f"tight-{scenario.name}-{policy}"
    try:
        config: dict[str, object] = {
            "upstream": {"base_url": fake.base_url, "timeout": 120},
            "policy": policy,
            "models": {MODEL: {"window": scenario.window, "encoding": "o200k_base"}},
            "state_dir": str(workdir / f"state-{session}"),
        }
        port, pid = processes.start_proxy(0, config, root=args.root, name=f"proxy-{session}")
        agent = Agent(
            url=f"http://127.0.0.1:{port}",
            model=MODEL,
            system=system,
            tools=tools,
            step_tokens=scenario.step_tokens,
            steps=scenario.steps,
            session=session,
            plan=plan,
            stream=args.stream,
        )
        run = agent.run(counter)
        events = proxy_events(port, session)
        processes.stop(pid)
        head = {"model": MODEL, "tools": tools, "messages": opening(system)}
        assert isinstance(fake.prefix_cache, PrefixCache)
        result = measure(
            fake.requests,
            run,
            events,
            counter=counter,
            window=scenario.window,
            fixed_and_task=sum(fake.prefix_cache.counted(head)),
            horizon=args.cache_horizon,
        )
    finally:
        processes.stop_all()
        fake.stop()
    fixed = counter.count_request({"model": MODEL, "tools": tools, "messages": opening(system)[:1]}).total
    return {
        "scenario": scenario.name,
        "root": str(args.root),
        "policy": policy,
        "stream": args.stream,
        "fixed_prompt_tokens": fixed,
        "task_tokens": counter.count_message(opening(system)[1], counter.encoding_for(MODEL)),
        "step_tokens": scenario.step_tokens,
        "steps_planned": scenario.steps,
        **result,
    }


def scenarios(args: argparse.Namespace) -> list[Scenario]:
    chosen = []
    for name in args.scenarios.split(","):
        if name not in SCENARIOS:
            raise SystemExit(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
        base = SCENARIOS[name]
        chosen.append(
            Scenario(
                name,
                base.window,
                args.fixed_tokens or base.fixed_tokens,
                args.step_tokens or base.step_tokens,
                args.steps or base.steps,
            )
        )
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenarios", default="8k,16k", help=f"of {', '.join(SCENARIOS)}")
    parser.add_argument("--policies", default="improved,full", help="the proxy's policy, by name")
    parser.add_argument("--steps", type=int, default=0, help="steps per session (default: the scenario's)")
    parser.add_argument("--step-tokens", type=int, default=0, help="tokens a step (default: the scenario's)")
    parser.add_argument(
        "--fixed-tokens",
        type=int,
        default=0,
        help="system prompt + tools (default: the scenario's)",
    )
    parser.add_argument(
        "--read-every", type=int, default=5, help="the model reads a saved output every N steps"
    )
    parser.add_argument("--cache-horizon", type=int, default=32, help="recent prompts the prefix cache keeps")
    parser.add_argument("--stream", action="store_true", help="the agent streams its requests")
    parser.add_argument(
        "--root", type=Path, default=HERE.parent, help="the checkout whose proxy (and policy code) runs"
    )
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--md-out", type=Path)
    parser.add_argument("--workdir", type=Path, help="keep the proxies' logs and state here")
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="tight-windows-") as directory:
        workdir = args.workdir or Path(directory)
        workdir.mkdir(parents=True, exist_ok=True)
        for scenario in scenarios(args):
            for policy in args.policies.split(","):
                log(f"{scenario.name} / {policy}: {scenario.steps} steps ...")
                results.append(run_one(scenario, policy, args, workdir))
    relative_costs(results)
    report = markdown(results)
    print(report)
    if args.md_out:
        args.md_out.write_text(report)
    if args.json_out:
        args.json_out.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
