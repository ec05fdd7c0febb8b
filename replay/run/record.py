"""The ``run`` record of ``results.json``: what a replay run was (its config and input, the
arms' policy specs, the models, how costs were computed, the package versions and git commit)
and when it finished."""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson

from replay.config import ReplayConfig, config_builtins
from replay.run.loading import Loaded


def run_record(
    config: ReplayConfig,
    loaded: Loaded,
    policy_specs: dict[str, Any],
    *,
    cost_note: dict[str, Any],
    seconds: float,
    input_path: Path,
    proxy: str,
) -> dict[str, Any]:
    """What the run was: its config and input, the arms' policy specs and their hash, the
    models, how costs were computed, the versions, when it finished and how long it took."""
    specs = {arm: policy_specs.get(arm) for arm in config.arms}
    return {
        "config": config_builtins(config),
        "input": str(input_path),
        "input_sha256": loaded.input_sha256,
        "policies": specs,
        "policies_sha256": hashlib.sha256(orjson.dumps(specs, option=orjson.OPT_SORT_KEYS)).hexdigest(),
        "context_window": config.context_window,
        "mode": config.mode,
        "summarizer": (
            "ledger (offline, model-free)"
            if config.summarizer_model is None
            else f"model {config.summarizer_model.model}"
        ),
        "answer_model": config.answer_model.model if config.answer_model else None,
        "cost": cost_note,
        "judge_model": config.judge_model.model if config.judge_model else None,
        "proxy": proxy,
        "versions": _versions(),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(seconds, 1),
    }


def _versions() -> dict[str, str | None]:
    return {
        "compaction-proxy": _version("compaction-proxy"),
        "python": platform.python_version(),
        "tiktoken": _version("tiktoken"),
        "git_commit": _git_commit(),
    }


def _git_commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None
