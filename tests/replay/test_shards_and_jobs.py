"""``--shard`` slices, the ``--jobs`` split and ``replay merge``'s checks, without processes:
the run directories merged here are written directly (manifest and parts, as a run writes them).
The end-to-end counterparts, through the real proxy, are in ``tests/e2e/test_replay_scale.py``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import msgspec
import orjson
import pytest

from proxy.config.settings import load_settings
from replay.config import ReplayConfig, load_replay_config
from replay.run.jobs import replay_cost, split_items
from replay.run.loading import load_cases
from replay.run.merge import MergeError, merge_runs
from replay.run.parts import CasePart, part_path, write_part
from replay.run.run import RunOptions, check_options, policy_specs_of, work_items
from replay.run.shards import ManifestError, Shard, read_manifest, run_manifest, write_manifest

ROOT = Path(__file__).resolve().parent.parent.parent
SAMPLE = ROOT / "tests" / "fixtures" / "trajectories_sample.jsonl"
CONFIG = load_replay_config(None, {"arms": ("full", "improved"), "context_window": 8000})


def test_a_shard_is_parsed_from_k_of_n() -> None:
    shard = Shard.parse("2/4")
    assert shard == Shard(4, frozenset({2})) and shard.label == "2/4" and not shard.complete
    assert [p for p in range(8) if shard.holds(p)] == [1, 5]
    assert Shard.parse(" 1 / 1 ").complete
    assert Shard.from_json(shard.to_json()) == shard


@pytest.mark.parametrize("text", ["0/2", "3/2", "2", "a/b", "1/0", "-1/2", ""])
def test_a_bad_shard_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--shard"):
        Shard.parse(text)


def test_every_case_is_in_exactly_one_shard_and_every_shard_names_the_same_input() -> None:
    whole = load_cases(SAMPLE, None, CONFIG.kinds)
    slices = [load_cases(SAMPLE, None, CONFIG.kinds, keep=Shard.parse(f"{k}/3").holds) for k in (1, 2, 3)]
    ids = [case.case_id for piece in slices for case in piece.cases]
    assert sorted(ids) == sorted(case.case_id for case in whole.cases) and len(set(ids)) == len(ids)
    assert {piece.input_sha256 for piece in slices} == {whole.input_sha256}
    for piece in slices:
        assert set(piece.questions) == {case.case_id for case in piece.cases}
    # --limit counts usable cases before the slicing: the first 3 cases, every other one.
    limited = load_cases(SAMPLE, 3, CONFIG.kinds, keep=Shard.parse("1/2").holds)
    assert [c.case_id for c in limited.cases] == [whole.cases[0].case_id, whole.cases[2].case_id]
    assert limited.input_sha256 == load_cases(SAMPLE, 3, CONFIG.kinds).input_sha256 != whole.input_sha256


def test_the_jobs_split_keeps_each_case_in_one_worker_and_is_the_same_every_time() -> None:
    loaded = load_cases(SAMPLE, None, CONFIG.kinds)
    options = RunOptions(input=SAMPLE, out=Path("unused"), config=CONFIG)
    items = work_items(loaded, options, policy_specs_of(load_settings(None, env={})))
    shares = split_items(items, 2)
    assert split_items(items, 2) == shares and len(shares) == 2
    assert sorted(id(i) for share in shares for i in share) == sorted(id(i) for i in items)
    for share in shares:
        positions = [items.index(item) for item in share]
        assert positions == sorted(positions)  # each share in the run's (arm-major) order
    workers_of_case = {
        item.case.case_id: {n for n, share in enumerate(shares) if item in share} for item in items
    }
    assert all(len(workers) == 1 for workers in workers_of_case.values())
    # Largest first to the least loaded: neither worker holds all the work.
    loads = [sum(replay_cost(i.case) for i in share) for share in shares]
    assert max(loads) < sum(loads)
    # More workers than cases: one case each, no empty worker.
    assert len(split_items(items, 10)) == len(loaded.cases)


def test_jobs_are_refused_with_a_given_proxy() -> None:
    settings = load_settings(None, env={})
    given = RunOptions(
        input=SAMPLE, out=Path("x"), config=CONFIG, proxy_url="http://127.0.0.1:1", upstream_port=9, jobs=2
    )
    with pytest.raises(ValueError, match="--jobs"):
        check_options(given, settings)
    with pytest.raises(ValueError, match="at least 1"):
        check_options(replace(given, proxy_url=None, upstream_port=0, jobs=0), settings)
    check_options(replace(given, proxy_url=None, upstream_port=0), settings)


# --- replay merge -------------------------------------------------------------------------------


def write_run(run_dir: Path, shard: Shard | None = None, config: ReplayConfig = CONFIG) -> Path:
    """A finished run directory as ``replay run`` leaves it (parts with made-up figures)."""
    settings = load_settings(None, env={})
    specs = policy_specs_of(settings)
    sliced = shard or Shard.whole()
    loaded = load_cases(SAMPLE, None, config.kinds, keep=None if sliced.complete else sliced.holds)
    options = RunOptions(input=SAMPLE, out=run_dir, config=config, shard=shard)
    manifest = run_manifest(
        input_path=SAMPLE,
        limit=None,
        shard=sliced,
        config=config,
        settings=settings,
        policy_specs=specs,
        proxy="own",
        loaded=loaded,
    )
    for item in work_items(loaded, options, specs):
        part = CasePart(item.arm, item.case.case_id, item.key, tokens_before=[len(item.case.steps)])
        write_part(part_path(run_dir, item.arm, item.case.case_id), part)
    write_manifest(run_dir, {**manifest, "finished": True, "seconds": 2.5, "unexpected_upstream_requests": 0})
    return run_dir


def test_merged_shards_hold_the_parts_of_one_run(tmp_path: Path) -> None:
    whole = merge_runs([write_run(tmp_path / "whole")], tmp_path / "whole-again")
    halves = [write_run(tmp_path / f"half{k}", Shard.parse(f"{k}/2")) for k in (1, 2)]
    merged = merge_runs(halves, tmp_path / "merged")
    assert merged.warnings == [] and merged.shard.complete
    assert merged.raw["parts"] == whole.raw["parts"] and len(merged.raw["parts"]) == 10
    assert [c.case_id for c in merged.raw["loaded"].cases] == [c.case_id for c in whole.raw["loaded"].cases]
    assert merged.config == CONFIG and merged.raw["seconds"] == 5.0
    saved = sorted(
        p.relative_to(tmp_path / "merged") for p in (tmp_path / "merged" / "parts").rglob("*.json")
    )
    assert len(saved) == 10
    manifest = read_manifest(tmp_path / "merged")
    assert manifest["shard"] == {"count": 2, "indices": [1, 2]} and len(manifest["merged_from"]) == 2
    # A merged run can be merged again (and merging twice into the same directory is harmless).
    again = merge_runs([tmp_path / "merged"], tmp_path / "merged")
    assert again.raw["parts"] == whole.raw["parts"]


def test_missing_shards_give_a_warning_and_the_results_of_the_shards_present(tmp_path: Path) -> None:
    runs = [write_run(tmp_path / f"s{k}", Shard.parse(f"{k}/3")) for k in (1, 3)]
    merged = merge_runs(runs, tmp_path / "merged")
    assert merged.shard.label == "1,3/3" and not merged.shard.complete
    assert merged.warnings == ["incomplete: shard 2 of 3 missing; the results cover shards 1,3/3"]
    whole = load_cases(SAMPLE, None, CONFIG.kinds)
    expected = [c.case_id for p, c in enumerate(whole.cases) if p % 3 != 1]
    assert [c.case_id for c in merged.raw["loaded"].cases] == expected


def test_runs_that_are_not_parts_of_one_run_are_not_merged(tmp_path: Path) -> None:
    first = write_run(tmp_path / "a", Shard.parse("1/2"))
    other_window = write_run(
        tmp_path / "b", Shard.parse("2/2"), load_replay_config(None, {"arms": ("full", "improved")})
    )
    with pytest.raises(MergeError, match="config_sha256"):
        merge_runs([first, other_window], tmp_path / "m")
    other_arms = write_run(
        tmp_path / "c", Shard.parse("2/2"), msgspec.structs.replace(CONFIG, arms=("full",))
    )
    with pytest.raises(MergeError, match="arms"):
        merge_runs([first, other_arms], tmp_path / "m")
    twice = write_run(tmp_path / "d", Shard.parse("1/2"))
    with pytest.raises(MergeError, match="shard 1/2 is in both"):
        merge_runs([first, twice], tmp_path / "m")
    thirds = write_run(tmp_path / "e", Shard.parse("2/3"))
    with pytest.raises(MergeError, match="different numbers of shards"):
        merge_runs([first, thirds], tmp_path / "m")
    with pytest.raises(MergeError, match="named twice"):
        merge_runs([first, first], tmp_path / "m")
    with pytest.raises(ManifestError, match=r"no manifest\.json"):
        merge_runs([first, tmp_path], tmp_path / "m")


def test_an_unfinished_or_incomplete_shard_is_not_merged(tmp_path: Path) -> None:
    first = write_run(tmp_path / "a", Shard.parse("1/2"))
    second = write_run(tmp_path / "b", Shard.parse("2/2"))
    manifest = read_manifest(second)
    write_manifest(second, {**manifest, "finished": False})
    with pytest.raises(MergeError, match="did not finish"):
        merge_runs([first, second], tmp_path / "m")
    write_manifest(second, manifest)
    next(iter((second / "parts" / "improved").glob("*.json"))).unlink()
    with pytest.raises(MergeError, match="no part for improved"):
        merge_runs([first, second], tmp_path / "m")


def test_the_input_is_found_by_its_hash(tmp_path: Path) -> None:
    run = write_run(tmp_path / "a")
    copy = tmp_path / "moved.jsonl"
    copy.write_bytes(SAMPLE.read_bytes())
    manifest = read_manifest(run)
    write_manifest(run, {**manifest, "input": str(tmp_path / "gone.jsonl")})
    with pytest.raises(MergeError, match="give its path with --input"):
        merge_runs([run], tmp_path / "m")
    assert len(merge_runs([run], tmp_path / "m", input_path=copy).raw["parts"]) == 10
    lines = SAMPLE.read_bytes().splitlines()
    copy.write_bytes(b"\n".join(lines[:-1]) + b"\n")
    with pytest.raises(MergeError, match="SHA-256 differs"):
        merge_runs([run], tmp_path / "m", input_path=copy)


def test_a_manifest_names_what_the_run_holds(tmp_path: Path) -> None:
    run = write_run(tmp_path / "a", Shard.parse("2/2"))
    manifest = orjson.loads((run / "manifest.json").read_bytes())
    assert manifest["shard"] == {"count": 2, "indices": [2]} and manifest["arms"] == ["full", "improved"]
    assert manifest["input_sha256"] == load_cases(SAMPLE, None, CONFIG.kinds).input_sha256
    assert len(manifest["cases"]) == 2 and manifest["config"]["context_window"] == 8000
    for name in ("config_sha256", "policies_sha256", "proxy_config_sha256"):
        assert len(manifest[name]) == 64
    # Concurrency does not change results: runs with another may be merged.
    faster = write_run(tmp_path / "b", Shard.parse("1/2"), msgspec.structs.replace(CONFIG, concurrency=9))
    assert merge_runs([faster, run], tmp_path / "m").shard.complete
    (run / "manifest.json").write_text("{}")
    with pytest.raises(ManifestError, match="not a version 1"):
        read_manifest(run)
