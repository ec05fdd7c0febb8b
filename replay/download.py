"""Download rows of the pinned ``nebius/SWE-rebench-openhands-trajectories`` revision.

Where the rows come from, and why:

- The Hub API ``/api/datasets/{id}/revision/{sha}`` names the commit (``sha``) and lists its
  files (``siblings[].rfilename``). The download refuses to start unless the Hub reports the
  pinned sha.
- Rows are read from the **parquet files of that commit**, at ``resolve/{sha}/{path}``, which
  never change. Each file is read page by page, one row group at a time, with HTTP range
  requests: the footer first (one request, which also gives the file size), then only the
  row groups that are needed. A file whose rows were all scanned in an earlier run is never
  fetched again.
- The datasets-server ``/rows`` API is not used: it serves only the dataset's *current*
  revision, at most 100 rows a page, and truncates large cells (``truncated_cells``), which
  would cut exactly the long trajectories this project needs. Only if the pinned commit holds
  no parquet files does the download fall back to the datasets-server parquet export
  (``/parquet``), and then only if the revision that export was built from (its
  ``X-Revision`` header) is the pinned one.

Rows are written as JSON lines exactly as the parquet export delivers them (see
``replay/rows.py``): every column of the dataset, nothing added. Progress lives in a sidecar
``<out>.manifest.json``: the pinned revision, the filters, the source row numbers taken and the
next source row to read. An interrupted run continues where it stopped; a run with other
filters refuses unless told to ``restart``.

Reading parquet needs ``pyarrow`` (``pip install -e '.[download]'``), imported only here, on
first use.
"""

from __future__ import annotations

import argparse
import email.utils
import importlib
import io
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import orjson

from replay.rows import row_messages, row_tools

DATASET = "nebius/SWE-rebench-openhands-trajectories"
REVISION = "35455389ab51bf5e2306bfd436ef72d0f98bf882"
HUB_ENDPOINT = "https://huggingface.co"
DATASETS_SERVER = "https://datasets-server.huggingface.co"
MANIFEST_VERSION = 1
# Token estimates use the project's offline counter (policies.tokens) with this encoding,
# over the cleaned messages and tool schemas of a row, as a chat request would carry them.
TOKEN_ENCODING = "o200k_base"  # noqa: S105 (an encoding name)
TAIL_BYTES = 64 * 1024
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class DownloadError(Exception):
    """A failure with a message meant for the user (no traceback needed)."""


@dataclass(frozen=True, slots=True)
class DownloadFilters:
    """Which rows to keep. ``resolved=None`` keeps any; token bounds are inclusive."""

    resolved: bool | None = None
    min_tokens: int | None = None
    max_tokens: int | None = None
    one_per_repo: bool = False

    def as_json(self) -> dict[str, Any]:
        return {
            "resolved": self.resolved,
            "min_tokens": self.min_tokens,
            "max_tokens": self.max_tokens,
            "one_per_repo": self.one_per_repo,
            "token_encoding": TOKEN_ENCODING,
        }

    @property
    def counts_tokens(self) -> bool:
        return self.min_tokens is not None or self.max_tokens is not None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retries for 429, 5xx and transport errors, with exponential backoff; a
    ``Retry-After`` header is honoured up to ``max_retry_after`` seconds."""

    attempts: int = 5
    base_delay: float = 1.0
    max_delay: float = 30.0
    max_retry_after: float = 300.0
    sleep: Callable[[float], None] = field(default=lambda seconds: time.sleep(seconds))


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


# --------------------------------------------------------------------------- HTTP


class _Http:
    def __init__(self, client: httpx.Client, retry: RetryPolicy, verbose: bool = False) -> None:
        self.client = client
        self.retry = retry
        self.verbose = verbose

    def _wait(self, host: str, problem: str, delay: float, attempt: int) -> None:
        if self.verbose:
            sys.stderr.write(
                f"download: {host}: {problem}; retrying in {delay:.0f} s "
                f"(attempt {attempt + 1}/{self.retry.attempts})\n"
            )
            sys.stderr.flush()
        self.retry.sleep(delay)

    def get(self, url: str, headers: dict[str, str] | None = None) -> httpx.Response:
        host = urlsplit(url).hostname or url
        last_problem = ""
        for attempt in range(1, self.retry.attempts + 1):
            try:
                response = self.client.get(url, headers=headers, follow_redirects=True)
            except httpx.TransportError as exc:
                last_problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                if attempt == self.retry.attempts:
                    raise DownloadError(
                        f"{host} unreachable ({last_problem}); check the network and try again"
                    ) from None
                self._wait(host, last_problem, self._backoff(attempt), attempt)
                continue
            if response.status_code in RETRY_STATUSES:
                last_problem = f"HTTP {response.status_code}"
                if attempt == self.retry.attempts:
                    break
                self._wait(host, last_problem, self._retry_delay(response, attempt, host), attempt)
                continue
            if response.status_code >= 400:
                raise DownloadError(f"{host} answered HTTP {response.status_code} for {url}")
            return response
        raise DownloadError(f"{host} kept failing ({last_problem}) after {self.retry.attempts} attempts")

    def _backoff(self, attempt: int) -> float:
        return float(min(self.retry.max_delay, self.retry.base_delay * 2 ** (attempt - 1)))

    def _retry_delay(self, response: httpx.Response, attempt: int, host: str) -> float:
        value = response.headers.get("retry-after")
        if value is None:
            return self._backoff(attempt)
        delay: float | None
        try:
            delay = float(value)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
                delay = (when - datetime.now(UTC)).total_seconds()
            except (TypeError, ValueError):
                delay = None
        if delay is None:
            return self._backoff(attempt)
        if delay > self.retry.max_retry_after:
            raise DownloadError(
                f"{host} asks to wait {delay:.0f} s (HTTP {response.status_code}); try again later"
            )
        return max(0.0, delay)


class _RemoteFile(io.RawIOBase):
    """A read-only, seekable view of a remote file through HTTP range requests.

    The first request fetches the last ``TAIL_BYTES`` (where parquet keeps its footer) and
    learns the size from ``Content-Range``; later reads fetch exactly the bytes asked for.
    A server that ignores ``Range`` sends the whole file once, which is then read from memory.
    """

    def __init__(self, http: _Http, url: str) -> None:
        super().__init__()
        self._http = http
        self._url = url
        self._pos = 0
        response = http.get(url, headers={"Range": f"bytes=-{TAIL_BYTES}"})
        self._tail = response.content
        if response.status_code == 206:
            start, total = _content_range(response.headers.get("content-range"), url)
            self._tail_start = start
            self.size = total
        else:
            self._tail_start = 0
            self.size = len(self._tail)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            self._pos = offset
        elif whence == io.SEEK_CUR:
            self._pos += offset
        elif whence == io.SEEK_END:
            self._pos = self.size + offset
        else:
            raise ValueError(f"bad whence {whence}")
        if self._pos < 0:
            raise ValueError("negative seek position")
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        end = min(self._pos + len(view), self.size)
        if end <= self._pos:
            return 0
        if self._pos >= self._tail_start:
            data = self._tail[self._pos - self._tail_start : end - self._tail_start]
        else:
            response = self._http.get(self._url, headers={"Range": f"bytes={self._pos}-{end - 1}"})
            if response.status_code == 206:
                data = response.content
            else:  # the whole file came back; keep it
                self._tail, self._tail_start = response.content, 0
                data = self._tail[self._pos : end]
            if len(data) != end - self._pos:
                raise DownloadError(f"short read from {self._url}: {len(data)} of {end - self._pos} bytes")
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)


def _content_range(value: str | None, url: str) -> tuple[int, int]:
    """``bytes START-END/TOTAL`` -> (START, TOTAL)."""
    unit, _, rest = (value or "").partition(" ")
    span, _, total = rest.partition("/")
    start = span.partition("-")[0]
    if unit != "bytes" or not start.isdigit() or not total.isdigit():
        raise DownloadError(f"unexpected Content-Range {value!r} from {url}")
    return int(start), int(total)


# --------------------------------------------------------------------------- source


@dataclass(frozen=True, slots=True)
class _SourceFile:
    path: str
    url: str


@dataclass(frozen=True, slots=True)
class _Source:
    kind: str
    files: tuple[_SourceFile, ...]


def _resolve_url(endpoint: str, dataset: str, revision: str, path: str) -> str:
    return f"{endpoint}/datasets/{dataset}/resolve/{revision}/{quote(path)}"


def _find_source(http: _Http, endpoint: str, datasets_server: str, dataset: str, revision: str) -> _Source:
    response = http.get(f"{endpoint}/api/datasets/{dataset}/revision/{revision}")
    info = _json(response)
    sha = info.get("sha") if isinstance(info, dict) else None
    if sha != revision:
        raise DownloadError(
            f"the Hub reports revision {sha!r} for {dataset}@{revision}, not the pinned {revision}; "
            "refusing to download rows of another revision"
        )
    siblings = info.get("siblings") or []
    paths = sorted(
        str(s["rfilename"])
        for s in siblings
        if isinstance(s, dict) and str(s.get("rfilename", "")).endswith(".parquet")
    )
    if paths:
        return _Source(
            "revision-files",
            tuple(_SourceFile(p, _resolve_url(endpoint, dataset, revision, p)) for p in paths),
        )
    # No parquet in the commit itself: the datasets-server export, if built from the pin.
    response = http.get(f"{datasets_server}/parquet?dataset={quote(dataset, safe='')}")
    served = response.headers.get("x-revision")
    if served != revision:
        raise DownloadError(
            f"{dataset}@{revision} holds no parquet files, and the datasets-server parquet export "
            f"is of revision {served!r}, not the pinned one; refusing to download"
        )
    listing = _json(response)
    entries = listing.get("parquet_files") if isinstance(listing, dict) else None
    files = sorted(
        (
            (str(e["config"]), str(e["split"]), str(e["filename"]), str(e["url"]))
            for e in entries or []
            if isinstance(e, dict)
        ),
    )
    if not files:
        raise DownloadError(f"no parquet files found for {dataset}@{revision}")
    return _Source(
        "parquet-export",
        tuple(_SourceFile(f"{config}/{split}/{name}", url) for config, split, name, url in files),
    )


def _json(response: httpx.Response) -> Any:
    try:
        return orjson.loads(response.content)
    except orjson.JSONDecodeError:
        raise DownloadError(f"{response.request.url} did not answer JSON") from None


def _pyarrow_parquet() -> Any:
    try:
        return importlib.import_module("pyarrow.parquet")
    except ImportError:
        raise DownloadError("reading the dataset needs pyarrow: pip install -e '.[download]'") from None


# --------------------------------------------------------------------------- manifest


def _write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2) + b"\n")
    os.replace(tmp, path)


def _load_manifest(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DownloadError(f"cannot read {path} ({exc}); rerun with --restart") from None
    if not isinstance(data, dict) or data.get("version") != MANIFEST_VERSION:
        raise DownloadError(f"{path} is not a manifest this version understands; rerun with --restart")
    return data


def _result(out: Path, manifest: dict[str, Any], added: int, resumed: bool) -> DownloadResult:
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


# --------------------------------------------------------------------------- download


class _Matcher:
    def __init__(self, filters: DownloadFilters, repos_taken: Sequence[str]) -> None:
        self.filters = filters
        self.repos = set(repos_taken)
        self._counter: Any = None

    def tokens(self, row: dict[str, Any]) -> int:
        if self._counter is None:
            from policies.tokens import TokenCounter

            self._counter = TokenCounter(default_encoding=TOKEN_ENCODING)
        body = {"messages": row_messages(row), "tools": row_tools(row)}
        return int(self._counter.count_request(body).total)

    def matches(self, row: dict[str, Any]) -> bool:
        f = self.filters
        if f.resolved is not None and row.get("resolved") is not f.resolved:
            return False
        repo = row.get("repo")
        if f.one_per_repo and isinstance(repo, str) and repo in self.repos:
            return False
        if f.counts_tokens:
            tokens = self.tokens(row)
            if f.min_tokens is not None and tokens < f.min_tokens:
                return False
            if f.max_tokens is not None and tokens > f.max_tokens:
                return False
        return True


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
        manifest = _load_manifest(mpath)
        _check_resume(manifest, out, limit, filters, dataset, revision)
        manifest["limit"] = limit
        if len(manifest["rows_taken"]) >= limit or manifest["exhausted"]:
            manifest["complete"] = True
            _write_manifest(mpath, manifest)
            return _result(out, manifest, 0, resumed=True)
        manifest["complete"] = False
    else:
        if out.exists() and out.stat().st_size > 0:
            raise DownloadError(f"{out} exists and has no manifest; rerun with --restart to overwrite it")
        manifest = {
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

    pq = _pyarrow_parquet()
    own_client = client is None
    http_client = client or httpx.Client(timeout=httpx.Timeout(60.0, connect=10.0))
    try:
        added = _run(
            _Http(http_client, retry or RetryPolicy(), verbose=progress),
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
    return _result(out, manifest, added, resumed)


def _check_resume(
    manifest: dict[str, Any],
    out: Path,
    limit: int,
    filters: DownloadFilters,
    dataset: str,
    revision: str,
) -> None:
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


def _run(
    http: _Http,
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
    source = _find_source(http, endpoint, datasets_server, manifest["dataset"], manifest["revision"])
    known = [(f["path"], f["url"]) for f in manifest["files"]]
    current = [(f.path, f.url) for f in source.files]
    if known and known != current:
        raise DownloadError(
            f"the source files changed since {out} was started ({source.kind}); rerun with --restart"
        )
    if not known:  # a fresh download: the files are created once the source is verified
        manifest["source"] = source.kind
        manifest["files"] = [{"path": f.path, "url": f.url, "rows": None} for f in source.files]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(b"")
        _write_manifest(mpath, manifest)

    matcher = _Matcher(filters, manifest["repos_taken"])
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
            parquet = pq.ParquetFile(_RemoteFile(http, entry["url"]), pre_buffer=True)
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
                        _write_manifest(mpath, manifest)
                        progress.update(len(manifest["rows_taken"]), index + 1, file_index, True)
                        progress.done()
                        return added
                    _write_manifest(mpath, manifest)
                next_row = group_end
                manifest["next_row"] = next_row
                _write_manifest(mpath, manifest)
                progress.update(len(manifest["rows_taken"]), next_row, file_index)
                group_start = group_end
            entry["rows"] = group_start - file_start
            file_start = group_start
            _write_manifest(mpath, manifest)
    manifest["exhausted"] = True
    manifest["complete"] = True
    _write_manifest(mpath, manifest)
    progress.update(len(manifest["rows_taken"]), next_row, len(manifest["files"]), True)
    progress.done()
    return added


# --------------------------------------------------------------------------- CLI


def add_download_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``compaction-proxy replay download``."""
    parser.add_argument("--out", required=True, help="JSON lines file to write (rows of the dataset)")
    parser.add_argument("--limit", type=int, required=True, help="write the first N matching rows")
    parser.add_argument(
        "--resolved", choices=("true", "false", "any"), default="any", help="keep only (un)resolved runs"
    )
    parser.add_argument("--min-tokens", type=int, help=f"at least this many tokens ({TOKEN_ENCODING})")
    parser.add_argument("--max-tokens", type=int, help=f"at most this many tokens ({TOKEN_ENCODING})")
    parser.add_argument("--one-per-repo", action="store_true", help="at most one row per repository")
    parser.add_argument("--restart", action="store_true", help="discard a previous partial download")
    parser.add_argument("--quiet", action="store_true", help="no progress line")


def run_download_command(args: argparse.Namespace) -> int:
    """Run a download from parsed ``add_download_arguments`` options; returns an exit code."""
    filters = DownloadFilters(
        resolved={"true": True, "false": False}.get(args.resolved),
        min_tokens=args.min_tokens,
        max_tokens=args.max_tokens,
        one_per_repo=args.one_per_repo,
    )
    endpoint = os.environ.get("HF_ENDPOINT", HUB_ENDPOINT).rstrip("/")
    try:
        result = download(
            Path(args.out),
            limit=args.limit,
            filters=filters,
            restart=args.restart,
            progress=not getattr(args, "quiet", False),
            endpoint=endpoint,
        )
    except DownloadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    state = "complete" if not result.exhausted else "complete (the dataset has no more matching rows)"
    print(
        f"{result.out}: {result.rows_written} rows ({result.rows_added} new) from "
        f"{DATASET}@{result.revision[:12]}, {state}; manifest {result.manifest}",
        file=sys.stderr,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replay.download", description=__doc__.split("\n")[0])
    add_download_arguments(parser)
    return run_download_command(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
