"""Slices of a run (``replay run --shard K/N``) and the manifest every run directory holds.

Case number ``i`` (0-based, counted among the usable cases of the input in file order, after
``--limit``) belongs to shard ``i mod N + 1``: the same slice on every machine that reads the
same file with the same settings. ``DIR/manifest.json`` names what a run directory holds: the
input's SHA-256, the shard, the arms, hashes of the replay settings, the arms' policies and the
proxy configuration, and the cases whose parts it holds. ``replay merge`` checks that the
manifests of the runs it combines agree (``replay.run.merge``).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from proxy.config.settings import Settings
from replay.config import ReplayConfig, config_builtins
from replay.run.loading import Loaded
from replay.session.proxy_process import replay_proxy_config

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
# Settings that never change a run's results (so runs may differ in them).
SETTINGS_OUTSIDE_THE_HASH = ("concurrency",)
_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


class ManifestError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Shard:
    """Some of the ``count`` slices of the cases (1-based ``indices``)."""

    count: int
    indices: frozenset[int]

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``K/N``: the K-th of N slices (1 <= K <= N)."""
        match = _SHARD.match(text)
        if match is None:
            raise ValueError(f"--shard {text!r}: expected K/N, for example 2/4")
        index, count = int(match.group(1)), int(match.group(2))
        if not 1 <= index <= count:
            raise ValueError(f"--shard {text}: K must be between 1 and N")
        return cls(count, frozenset({index}))

    @classmethod
    def whole(cls) -> Shard:
        return cls(1, frozenset({1}))

    def holds(self, position: int) -> bool:
        """Whether the usable case at ``position`` (0-based) belongs to these slices."""
        return position % self.count + 1 in self.indices

    @property
    def complete(self) -> bool:
        return len(self.indices) == self.count

    @property
    def label(self) -> str:
        return ",".join(str(i) for i in sorted(self.indices)) + f"/{self.count}"

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "indices": sorted(self.indices)}

    @classmethod
    def from_json(cls, data: Any) -> Shard:
        try:
            count, indices = int(data["count"]), frozenset(int(i) for i in data["indices"])
        except (TypeError, KeyError, ValueError):
            raise ManifestError(f"not a shard: {data!r}") from None
        if count < 1 or not indices or not all(1 <= i <= count for i in indices):
            raise ManifestError(f"not a shard: {data!r}")
        return cls(count, indices)


def digest(data: Any) -> str:
    return hashlib.sha256(orjson.dumps(data, option=orjson.OPT_SORT_KEYS)).hexdigest()


def run_manifest(
    *,
    input_path: Path,
    limit: int | None,
    shard: Shard,
    config: ReplayConfig,
    settings: Settings,
    policy_specs: dict[str, Any],
    proxy: str,
    loaded: Loaded,
) -> dict[str, Any]:
    """The manifest of a run that has started (``finished`` false until it ends)."""
    builtins = config_builtins(config)
    policies = {arm: policy_specs.get(arm) for arm in config.arms}
    # The proxy configuration the run derives, with placeholders where machines differ.
    proxy_config = replay_proxy_config(settings, config, "http://127.0.0.1:0/v1", Path("proxy-state"))
    return {
        "manifest_version": MANIFEST_VERSION,
        "input": str(input_path.resolve()),
        "input_sha256": loaded.input_sha256,
        "limit": limit,
        "shard": shard.to_json(),
        "arms": list(config.arms),
        "config": builtins,
        "config_sha256": digest({k: v for k, v in builtins.items() if k not in SETTINGS_OUTSIDE_THE_HASH}),
        "policies": policies,
        "policies_sha256": digest(policies),
        "proxy_config_sha256": digest(proxy_config),
        "proxy": proxy,
        "cases": [case.case_id for case in loaded.cases],
        "finished": False,
        "seconds": None,
        "unexpected_upstream_requests": None,
    }


def write_manifest(run_dir: Path, manifest: dict[str, Any]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / MANIFEST_NAME
    temporary = path.with_suffix(".tmp")
    temporary.write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
    temporary.replace(path)


def read_manifest(run_dir: Path) -> dict[str, Any]:
    path = run_dir / MANIFEST_NAME
    if not path.exists():
        raise ManifestError(f"{run_dir}: no {MANIFEST_NAME} (not a replay run directory?)")
    try:
        manifest = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as error:
        raise ManifestError(f"{path}: not JSON ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("manifest_version") != MANIFEST_VERSION:
        raise ManifestError(f"{path}: not a version {MANIFEST_VERSION} replay manifest")
    return manifest
