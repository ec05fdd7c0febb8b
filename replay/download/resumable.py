"""``download()``: write the first rows of the pinned revision that pass the filters, resuming
from the manifest. Files are read one row group at a time; a file whose rows were all scanned
in an earlier run is never fetched again.

Reading parquet needs ``pyarrow`` (``pip install -e '.[download]'``), imported only here, on
first use, so that the rest of the harness runs without it.
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from replay.download.errors import DownloadError
from replay.download.filters import DownloadFilters, RowMatcher
from replay.download.hub import DATASET, DATASETS_SERVER, HUB_ENDPOINT, REVISION, find_source
from replay.download.manifest import (
    DownloadResult,
    check_resume,
    load_manifest,
    manifest_path,
    new_manifest,
    result_of,
    write_manifest,
)
from replay.download.remote_file import RemoteFile
from replay.download.retrying_http import RetryingHttp, RetryPolicy


def _pyarrow_parquet() -> Any:
    try:
        return importlib.import_module("pyarrow.parquet")
    except ImportError:
        raise DownloadError("reading the dataset needs pyarrow: pip install -e '.[download]'") from None


class _Progress:
    def __init__(self, enabled: bool, limit: int, files: int) -> None:
        self.enabled = enabled
        self.limit = limit
        self.files = files
        self._last = 0.0

    def update(self, taken: int, scanned: int, file_index: int, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.2:
            return
        self._last = now
        sys.stderr.write(
            f"\rdownload: {taken}/{self.limit} rows taken, {scanned} source rows read "
            f"(file {file_index}/{self.files})  "
        )
        sys.stderr.flush()

    def done(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def download(
    out: Path,
    *,
    limit: int,
    filters: DownloadFilters | None = None,
    restart: bool = False,
    client: httpx.Client | None = None,
    progress: bool = True,
    retry: RetryPolicy | None = None,
    endpoint: str = HUB_ENDPOINT,
    datasets_server: str = DATASETS_SERVER,
    dataset: str = DATASET,
    revision: str = REVISION,
) -> DownloadResult:
    """Write the first ``limit`` rows of the pinned revision that pass ``filters`` to ``out``.

    Resumable: rerunning with the same arguments continues from the manifest, or returns at
    once when the file is already complete; a larger ``limit`` extends the file. Other filters
    (or a smaller limit than rows already written) raise ``DownloadError`` unless
    ``restart`` is set, which deletes the file and its manifest first.
    """
    filters = filters or DownloadFilters()
    if limit < 1:
        raise DownloadError("--limit must be at least 1")
    low, high = filters.min_tokens, filters.max_tokens
    if low is not None and high is not None and low > high:
        raise DownloadError("--min-tokens is larger than --max-tokens")
    out = Path(out)
    mpath = manifest_path(out)
    if restart:
        out.unlink(missing_ok=True)
        mpath.unlink(missing_ok=True)

    resumed = mpath.exists()
    if resumed:
        manifest = load_manifest(mpath)
        check_resume(manifest, out, limit, filters, dataset, revision)
        manifest["limit"] = limit
        if len(manifest["rows_taken"]) >= limit or manifest["exhausted"]:
            manifest["complete"] = True
            write_manifest(mpath, manifest)
            return result_of(out, manifest, 0, resumed=True)
        manifest["complete"] = False
    else:
        if out.exists() and out.stat().st_size > 0:
            raise DownloadError(f"{out} exists and has no manifest; rerun with --restart to overwrite it")
        manifest = new_manifest(dataset, revision, filters, limit)

    pq = _pyarrow_parquet()
    own_client = client is None
    http_client = client or httpx.Client(timeout=httpx.Timeout(60.0, connect=10.0))
    try:
        added = _scan(
            RetryingHttp(http_client, retry or RetryPolicy(), verbose=progress),
            pq,
            out,
            mpath,
            manifest,
            limit,
            filters,
            progress,
            endpoint,
            datasets_server,
        )
    finally:
        if own_client:
            http_client.close()
    return result_of(out, manifest, added, resumed)


def _check_source(
    http: RetryingHttp, out: Path, mpath: Path, manifest: dict[str, Any], endpoint: str, datasets_server: str
) -> None:
    """The source's files are the ones the download started from (a fresh download records
    them, and creates its output once the source is verified)."""
    source = find_source(http, endpoint, datasets_server, manifest["dataset"], manifest["revision"])
    known = [(f["path"], f["url"]) for f in manifest["files"]]
    current = [(f.path, f.url) for f in source.files]
    if known and known != current:
        raise DownloadError(
            f"the source files changed since {out} was started ({source.kind}); rerun with --restart"
        )
    if not known:
        manifest["source"] = source.kind
        manifest["files"] = [{"path": f.path, "url": f.url, "rows": None} for f in source.files]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(b"")
        write_manifest(mpath, manifest)


def _scan(
    http: RetryingHttp,
    pq: Any,
    out: Path,
    mpath: Path,
    manifest: dict[str, Any],
    limit: int,
    filters: DownloadFilters,
    progress_enabled: bool,
    endpoint: str,
    datasets_server: str,
) -> int:
    """Read source rows from ``manifest["next_row"]`` on, appending the matching ones to
    ``out`` until ``limit`` rows are taken or the source ends; returns the rows added."""
    _check_source(http, out, mpath, manifest, endpoint, datasets_server)
    matcher = RowMatcher(filters, manifest["repos_taken"])
    progress = _Progress(progress_enabled, limit, len(manifest["files"]))
    added = 0
    next_row = int(manifest["next_row"])
    file_start = 0
    with out.open("ab") as handle:
        for file_index, entry in enumerate(manifest["files"], start=1):
            rows = entry["rows"]
            if rows is not None and file_start + rows <= next_row:
                file_start += rows
                continue
            # pre_buffer: one coalesced range request per row group, not one per column page
            parquet = pq.ParquetFile(RemoteFile(http, entry["url"]), pre_buffer=True)
            group_start = file_start
            for group in range(parquet.metadata.num_row_groups):
                group_rows = int(parquet.metadata.row_group(group).num_rows)
                group_end = group_start + group_rows
                if group_end <= next_row:
                    group_start = group_end
                    continue
                for offset, row in enumerate(parquet.read_row_group(group).to_pylist()):
                    index = group_start + offset
                    if index < next_row or not matcher.matches(row):
                        continue
                    handle.write(orjson.dumps(row, default=_json_default) + b"\n")
                    handle.flush()
                    added += 1
                    manifest["rows_taken"].append(index)
                    repo = row.get("repo")
                    if filters.one_per_repo and isinstance(repo, str):
                        matcher.repos.add(repo)
                        manifest["repos_taken"].append(repo)
                    manifest["out_bytes"] = handle.tell()
                    manifest["next_row"] = index + 1
                    if len(manifest["rows_taken"]) >= limit:
                        manifest["complete"] = True
                        write_manifest(mpath, manifest)
                        progress.update(len(manifest["rows_taken"]), index + 1, file_index, True)
                        progress.done()
                        return added
                    write_manifest(mpath, manifest)
                next_row = group_end
                manifest["next_row"] = next_row
                write_manifest(mpath, manifest)
                progress.update(len(manifest["rows_taken"]), next_row, file_index)
                group_start = group_end
            entry["rows"] = group_start - file_start
            file_start = group_start
            write_manifest(mpath, manifest)
    manifest["exhausted"] = True
    manifest["complete"] = True
    write_manifest(mpath, manifest)
    progress.update(len(manifest["rows_taken"]), next_row, len(manifest["files"]), True)
    progress.done()
    return added
