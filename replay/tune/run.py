"""``replay tune`` run for real: each batch of candidate policies replayed beside ``full``
through the harness (from saved parts when already run), judged by the release gate, and the
search's frontier and winner written out. The search itself is ``replay.tune.search``."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import yaml

from proxy.config.settings import load_settings
from replay.config import Gate, load_replay_config
from replay.report.gate import evaluate_gate
from replay.report.run_results import results_of_run
from replay.run.run import RunOptions, run_replay
from replay.tune.report import write_outputs
from replay.tune.search import KNOBS, Candidate, Evaluate, Measured, search, searchable


@dataclass(frozen=True)
class TuneOptions:
    input: Path
    out: Path
    base: str
    trials: int = 12
    rounds: int = 3
    seed: int = 0
    proxy_config: Path | None = None
    replay_config: Path | None = None
    context_window: int | None = None
    limit: int | None = None
    jobs: int = 1
    progress: bool = False


def replay_evaluator(options: TuneOptions, base_config: Mapping[str, Any]) -> Evaluate:
    """Replays a batch of candidates (beside ``full``, from saved parts when already run) and
    returns each one's arm figures and gate verdict."""
    known: dict[str, dict[str, Any]] = {}

    def evaluate(batch: list[Candidate]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
        for candidate in batch:
            if candidate.knobs:
                known[candidate.name] = candidate.policy()
        proxy_config = {**base_config, "policies": {**(base_config.get("policies") or {}), **known}}
        config_path = options.out / "proxy-config.yml"
        config_path.write_text(yaml.safe_dump(proxy_config, sort_keys=False))
        arms = ("full", *dict.fromkeys(c.name for c in batch))
        overrides: dict[str, Any] = {"arms": arms, "context_window": options.context_window}
        config = load_replay_config(options.replay_config, overrides)
        run = RunOptions(
            input=options.input,
            out=options.out / "run",
            config=config,
            proxy_config=config_path,
            limit=options.limit,
            progress=options.progress,
            jobs=options.jobs,
        )
        raw = asyncio.run(run_replay(run))
        results = results_of_run(config, raw, options.input)
        # Without a gate in the replay config, the default thresholds still apply: tune never
        # recommends a policy that loses evidence or breaks the protocol.
        declared = config.gate if config.gate is not None else Gate()
        gate = msgspec.structs.replace(declared, arms=tuple(a for a in arms if a != "full"))
        verdicts = evaluate_gate(gate, results["arms"])["verdicts"]
        return {c.name: (results["arms"][c.name], verdicts[c.name]) for c in batch}

    return evaluate


def run_tune(options: TuneOptions) -> Measured | None:
    options.out.mkdir(parents=True, exist_ok=True)
    base_config: dict[str, Any] = {}
    if options.proxy_config is not None:
        base_config = yaml.safe_load(options.proxy_config.read_text(encoding="utf-8")) or {}
    settings = load_settings(options.proxy_config, env={})
    if options.base not in settings.policies:
        raise ValueError(f"no policy named {options.base!r} (policies: {', '.join(settings.policies)})")
    stages = settings.policies[options.base].stages
    if not searchable(stages):
        raise ValueError(f"{options.base} has none of the stages tune searches ({', '.join(KNOBS)})")
    state = search(
        options.base,
        stages,
        replay_evaluator(options, base_config),
        trials=options.trials,
        rounds=options.rounds,
        seed=options.seed,
    )
    return write_outputs(options.out, state, options.base)
