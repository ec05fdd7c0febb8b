"""The sidecar ``<out>.manifest.json`` that makes a download resumable: the pinned revision,
the filters, the source files, the source row numbers taken and the next source row to read.

It is rewritten atomically after every row, so an interrupted run knows exactly which bytes
of the output it counted, and a run with other arguments can be refused before it mixes rows.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from replay.download.errors import DownloadError
from replay.download.filters import DownloadFilters

MANIFEST_VERSION = 1


@dataclass(frozen=True, slots=True)
class DownloadResult:
    out: Path
    manifest: Path
    revision: str
    source: str
    rows_written: int
    rows_added: int
    next_row: int
    complete: bool
    exhausted: bool
    resumed: bool
    source_rows: list[int] = field(default_factory=list)


def manifest_path(out: Path) -> Path:
    return out.with_name(out.name + ".manifest.json")


def new_manifest(dataset: str, revision: str, filters: DownloadFilters, limit: int) -> dict[str, Any]:
    """The state of a download that has read nothing yet (its source is found on the first run)."""
    return {
        "version": MANIFEST_VERSION,
        "dataset": dataset,
        "revision": revision,
        "source": None,
        "files": [],
        "filters": filters.as_json(),
        "limit": limit,
        "rows_taken": [],
        "repos_taken": [],
        "next_row": 0,
        "out_bytes": 0,
        "exhausted": False,
        "complete": False,
    }


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2) + b"\n")
    os.replace(tmp, path)


def load_manifest(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DownloadError(f"cannot read {path} ({exc}); rerun with --restart") from None
    if not isinstance(data, dict) or data.get("version") != MANIFEST_VERSION:
        raise DownloadError(f"{path} is not a manifest this version understands; rerun with --restart")
    return data


def check_resume(
    manifest: dict[str, Any],
    out: Path,
    limit: int,
    filters: DownloadFilters,
    dataset: str,
    revision: str,
) -> None:
    """Refuse to continue a download made with other arguments; drop a row written after the
    manifest's last update (a crash between the two writes)."""
    mpath = manifest_path(out)
    if manifest.get("dataset") != dataset or manifest.get("revision") != revision:
        raise DownloadError(
            f"{mpath} is for {manifest.get('dataset')}@{manifest.get('revision')}, not "
            f"{dataset}@{revision}; rerun with --restart to start over"
        )
    if manifest.get("filters") != filters.as_json():
        raise DownloadError(
            f"{out} was started with other filters ({manifest.get('filters')}); "
            "rerun with the same filters to continue, or with --restart to start over"
        )
    if len(manifest["rows_taken"]) > limit:
        raise DownloadError(
            f"{out} already holds {len(manifest['rows_taken'])} rows, more than --limit {limit}; "
            "rerun with --restart to start over"
        )
    size = out.stat().st_size if out.exists() else -1
    expected = int(manifest["out_bytes"])
    if size < expected:
        raise DownloadError(f"{out} is shorter than its manifest records; rerun with --restart")
    if size > expected:  # a row written after the last manifest update: not counted, drop it
        with out.open("r+b") as handle:
            handle.truncate(expected)


def result_of(out: Path, manifest: dict[str, Any], added: int, resumed: bool) -> DownloadResult:
    taken = [int(r) for r in manifest["rows_taken"]]
    return DownloadResult(
        out=out,
        manifest=manifest_path(out),
        revision=str(manifest["revision"]),
        source=str(manifest.get("source") or ""),
        rows_written=len(taken),
        rows_added=added,
        next_row=int(manifest["next_row"]),
        complete=bool(manifest["complete"]),
        exhausted=bool(manifest["exhausted"]),
        resumed=resumed,
        source_rows=taken,
    )
