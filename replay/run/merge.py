"""``replay merge --out MERGED DIR...``: the run directories of ``--shard`` runs made one run.

The manifests must agree (the input's SHA-256, ``--limit``, the arms, the replay settings, the
arms' policies and the proxy configuration; ``concurrency`` may differ) and their shards must
be disjoint slices of the same N. Each shard's parts are checked against the keys a single
run would give them, then linked (or copied) into ``MERGED/parts``; the input is read again
for the cases and questions, and the caller builds ``results.json`` and the reports from them
exactly as ``replay run`` does. Shards missing from 1..N give a warning and results of the
slices present.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replay.config import ReplayConfig, load_replay_config
from replay.run.loading import Loaded, load_cases
from replay.run.parts import CasePart, WorkItem, part_key, part_path, read_part
from replay.run.shards import Shard, read_manifest, write_manifest

# What every manifest of a merge must hold alike.
AGREEING_FIELDS = (
    "input_sha256",
    "limit",
    "arms",
    "config_sha256",
    "policies_sha256",
    "proxy_config_sha256",
)


class MergeError(ValueError):
    pass


@dataclass(slots=True)
class Merged:
    config: ReplayConfig
    input_path: Path
    shard: Shard
    # What ``run_replay`` returns, for the same results-building code.
    raw: dict[str, Any]
    warnings: list[str] = field(default_factory=list)


def merge_runs(run_dirs: Sequence[Path], out: Path, input_path: Path | None = None) -> Merged:
    if not run_dirs:
        raise MergeError("name at least one run directory")
    if len({d.resolve() for d in run_dirs}) != len(run_dirs):
        raise MergeError("a run directory is named twice")
    manifests = [(run_dir, read_manifest(run_dir)) for run_dir in run_dirs]
    first_dir, first = manifests[0]
    for run_dir, manifest in manifests:
        for name in AGREEING_FIELDS:
            if manifest.get(name) != first.get(name):
                raise MergeError(
                    f"{run_dir} and {first_dir} are not parts of one run: their {name} differs "
                    f"({manifest.get(name)!r} and {first.get(name)!r})"
                )
        if not manifest.get("finished"):
            raise MergeError(
                f"{run_dir}: the run did not finish (run it again with the same options: it resumes)"
            )
    shard, warnings = _union_of_shards([(d, Shard.from_json(m.get("shard"))) for d, m in manifests])
    config = load_replay_config(None, dict(first["config"]))
    source = input_path or Path(first["input"])
    if not source.exists():
        raise MergeError(f"the input file {source} is not here: give its path with --input")
    loaded = load_cases(source, first["limit"], config.kinds, keep=None if shard.complete else shard.holds)
    if loaded.input_sha256 != first["input_sha256"]:
        raise MergeError(f"{source} is not the input the runs replayed (its SHA-256 differs)")
    owners = _owner_of_each_case(manifests, loaded)
    policy_specs: dict[str, Any] = dict(first["policies"])
    parts: dict[tuple[str, str], CasePart] = {}
    for arm in config.arms:
        for case in loaded.cases:
            item = WorkItem(arm, case, part_key(arm, case, config, policy_specs[arm], loaded.input_sha256))
            owner = owners[case.case_id]
            saved = part_path(owner, arm, case.case_id)
            part = read_part(saved, item.key)
            if part is None:
                raise MergeError(
                    f"{owner}: no part for {arm} on {case.case_id} saved with the expected key "
                    "(run that shard again with the same options: it resumes)"
                )
            _link_or_copy(saved, part_path(out, arm, case.case_id))
            parts[(arm, case.case_id)] = part
    seconds = sum(float(m.get("seconds") or 0.0) for _, m in manifests)
    unexpected = sum(int(m.get("unexpected_upstream_requests") or 0) for _, m in manifests)
    write_manifest(
        out,
        {
            **first,
            "input": str(source.resolve()),
            "shard": shard.to_json(),
            "cases": [case.case_id for case in loaded.cases],
            "seconds": round(seconds, 3),
            "unexpected_upstream_requests": unexpected,
            "merged_from": [str(d.resolve()) for d in run_dirs],
        },
    )
    raw = {
        "loaded": loaded,
        "parts": parts,
        "seconds": seconds,
        "policy_specs": policy_specs,
        "proxy_url": first.get("proxy", "own"),
        "unexpected_upstream_requests": unexpected,
    }
    return Merged(config, source, shard, raw, warnings)


def _union_of_shards(shards: Sequence[tuple[Path, Shard]]) -> tuple[Shard, list[str]]:
    counts = {shard.count for _, shard in shards}
    if len(counts) != 1:
        raise MergeError(f"the runs are slices of different numbers of shards: {sorted(counts)}")
    count = counts.pop()
    holder: dict[int, Path] = {}
    for run_dir, shard in shards:
        for index in sorted(shard.indices):
            if index in holder:
                raise MergeError(f"shard {index}/{count} is in both {holder[index]} and {run_dir}")
            holder[index] = run_dir
    union = Shard(count, frozenset(holder))
    warnings = []
    if not union.complete:
        missing = sorted(set(range(1, count + 1)) - set(holder))
        warnings.append(
            f"incomplete: shard{'s' if len(missing) > 1 else ''} "
            f"{', '.join(str(i) for i in missing)} of {count} missing; the results cover shards {union.label}"
        )
    return union, warnings


def _owner_of_each_case(manifests: Sequence[tuple[Path, dict[str, Any]]], loaded: Loaded) -> dict[str, Path]:
    owners: dict[str, Path] = {}
    for run_dir, manifest in manifests:
        for case_id in manifest.get("cases") or []:
            if case_id in owners:
                raise MergeError(f"case {case_id} is in both {owners[case_id]} and {run_dir}")
            owners[case_id] = run_dir
    expected = {case.case_id for case in loaded.cases}
    if set(owners) != expected:
        strays = sorted(set(owners) - expected)[:5]
        absent = sorted(expected - set(owners))[:5]
        raise MergeError(
            "the runs' cases are not the input's cases of these shards "
            f"(not in the input: {strays}; in no run: {absent}); were they run by another version?"
        )
    return owners


def _link_or_copy(source: Path, target: Path) -> None:
    """``target`` made the same file as ``source``: a hard link where the file system allows."""
    if target.exists() and os.path.samefile(source, target):
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_suffix(".tmp")
    temporary.unlink(missing_ok=True)
    try:
        os.link(source, temporary)
    except OSError:
        shutil.copyfile(source, temporary)
    temporary.replace(target)
