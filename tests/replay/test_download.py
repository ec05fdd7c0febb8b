"""``replay/download.py`` against recorded-shape Hugging Face responses (respx; no network).

The Hub API answers come from ``tests/fixtures/hf/*.json``; the dataset's parquet files are
written at test time from ``tests/fixtures/hf/rows.jsonl`` (nine rows, two files, two rows per
row group) and served with HTTP range requests behind a redirect, as ``resolve/`` URLs are.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from policies.tokens import TokenCounter
from replay import download as dl
from replay.rows import iter_rows, row_messages, row_tools

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
PIN = dl.REVISION
HUB = "https://huggingface.co"
REVISION_URL = f"{HUB}/api/datasets/{dl.DATASET}/revision/{PIN}"
EXPORT_URL = f"{dl.DATASETS_SERVER}/parquet"
FILES = ("data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet")
EXPORT_FILES = ("default/train/0000.parquet", "default/train/0001.parquet")
ROWS_IN_FIRST_FILE = 5
NO_RETRY_WAIT = dl.RetryPolicy(attempts=3, sleep=lambda seconds: None)

Handler = Callable[[httpx.Request, str], httpx.Response | None]


def fixture_json(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


@pytest.fixture(scope="module")
def fixture_rows() -> list[dict[str, Any]]:
    return list(iter_rows(FIXTURES / "rows.jsonl"))


@pytest.fixture(scope="module")
def blobs(fixture_rows: list[dict[str, Any]]) -> list[bytes]:
    table = pa.Table.from_pylist(fixture_rows)
    parts = [table.slice(0, ROWS_IN_FIRST_FILE), table.slice(ROWS_IN_FIRST_FILE)]
    out = []
    for part in parts:
        buffer = io.BytesIO()
        pq.write_table(part, buffer, row_group_size=2)
        out.append(buffer.getvalue())
    return out


@pytest.fixture(scope="module")
def dataset_rows(blobs: list[bytes]) -> list[dict[str, Any]]:
    """The rows exactly as the parquet files deliver them (what the download must write)."""
    rows: list[dict[str, Any]] = []
    for blob in blobs:
        rows.extend(pq.read_table(io.BytesIO(blob)).to_pylist())
    return rows


class FakeHub:
    """Hub API, ``resolve/`` (302 to a CDN host) and ranged file reads, with fault hooks."""

    def __init__(self, router: respx.MockRouter, blobs: list[bytes]) -> None:
        self.router = router
        self.revision_info = fixture_json("revision.json")
        self.fault: Handler | None = None
        self.reads: list[tuple[str, str | None]] = []
        self.revision_route = router.get(REVISION_URL).mock(side_effect=self._revision)
        for path, blob in zip(FILES, blobs, strict=True):
            self._serve(f"{HUB}/datasets/{dl.DATASET}/resolve/{PIN}/{path}", path, blob)
        for path, blob in zip(EXPORT_FILES, blobs, strict=True):
            url = f"{HUB}/datasets/{dl.DATASET}/resolve/refs%2Fconvert%2Fparquet/{path}"
            self._serve(url, path, blob)

    def _revision(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=self.revision_info)

    def _serve(self, url: str, path: str, blob: bytes) -> None:
        cdn = f"https://cas-bridge.xethub.hf.co/xet-bridge-us/{path}"
        self.router.get(url).mock(
            return_value=httpx.Response(302, headers={"Location": f"{cdn}?X-Amz-Signature=abc"})
        )

        def ranged(request: httpx.Request) -> httpx.Response:
            spec = request.headers.get("range")
            self.reads.append((path, spec))
            if self.fault is not None:
                faulty = self.fault(request, path)
                if faulty is not None:
                    return faulty
            if spec is None:
                return httpx.Response(200, content=blob)
            first, _, last = spec.removeprefix("bytes=").partition("-")
            if first == "":
                start, end = max(0, len(blob) - int(last)), len(blob) - 1
            else:
                start, end = int(first), min(int(last), len(blob) - 1)
            headers = {"Content-Range": f"bytes {start}-{end}/{len(blob)}"}
            return httpx.Response(206, content=blob[start : end + 1], headers=headers)

        self.router.get(cdn).mock(side_effect=ranged)

    def files_read(self) -> set[str]:
        return {path for path, _ in self.reads}


@pytest.fixture
def hub(blobs: list[bytes]) -> Iterator[FakeHub]:
    with respx.mock(assert_all_mocked=True, assert_all_called=False) as router:
        yield FakeHub(router, blobs)


def run(out: Path, limit: int = 100, **kwargs: Any) -> dl.DownloadResult:
    kwargs.setdefault("retry", NO_RETRY_WAIT)
    return dl.download(out, limit=limit, progress=False, **kwargs)


def manifest(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(dl.manifest_path(out).read_text())
    return data


def written(out: Path) -> list[dict[str, Any]]:
    return list(iter_rows(out))


# --------------------------------------------------------------------------- shape, paging


def test_downloads_every_row_in_the_dataset_shape(
    tmp_path: Path, hub: FakeHub, dataset_rows: list[dict[str, Any]], fixture_rows: list[dict[str, Any]]
) -> None:
    out = tmp_path / "rows.jsonl"
    result = run(out)

    assert result.rows_written == result.rows_added == 9
    assert result.exhausted and result.complete and not result.resumed
    assert result.source == "revision-files"
    rows = written(out)
    assert rows == dataset_rows
    for row, original in zip(rows, fixture_rows, strict=True):
        # every column of the dataset, nothing added (no "source": not a nebius column)
        assert list(row) == list(original)
        assert all(
            set(m) == {"content", "name", "role", "tool_call_id", "tool_calls"} for m in row["trajectory"]
        )
        # the project's readers restore the same conversation
        assert row_messages(row) == row_messages(original)
        assert [t["function"]["name"] for t in row_tools(row)] == [
            t["function"]["name"] for t in row_tools(original)
        ]
    state = manifest(out)
    assert state["revision"] == PIN and state["dataset"] == dl.DATASET
    assert state["rows_taken"] == list(range(9)) and state["next_row"] == 9
    assert [f["path"] for f in state["files"]] == list(FILES)
    assert [f["rows"] for f in state["files"]] == [5, 4]
    assert state["out_bytes"] == out.stat().st_size


def test_reads_page_by_page_and_stops_at_the_limit(
    tmp_path: Path, hub: FakeHub, blobs: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dl, "TAIL_BYTES", 1024)  # smaller than the fixture's footer
    out = tmp_path / "rows.jsonl"
    result = run(out, limit=3)

    assert result.rows_written == 3 and result.complete and not result.exhausted
    assert result.source_rows == [0, 1, 2]
    assert manifest(out)["next_row"] == 3
    assert hub.files_read() == {FILES[0]}  # the second file is never touched
    ranges = [str(spec) for _, spec in hub.reads]
    assert "None" not in ranges and ranges[0] == "bytes=-1024"  # only range requests
    # the rest of the footer, then one range per row group read (two of three)
    assert len(ranges) == 4
    footer_start = int(ranges[1].removeprefix("bytes=").partition("-")[0])
    assert footer_start > 0 and ranges[1].endswith(f"-{len(blobs[0]) - 1}")


def test_limit(tmp_path: Path, hub: FakeHub, dataset_rows: list[dict[str, Any]]) -> None:
    out = tmp_path / "rows.jsonl"
    assert run(out, limit=2).rows_written == 2
    assert written(out) == dataset_rows[:2]


# --------------------------------------------------------------------------- filters


@pytest.mark.parametrize(
    ("resolved", "expected"),
    [(True, [0, 1, 4, 5, 6, 7, 8]), (False, [2, 3]), (None, list(range(9)))],
)
def test_resolved_filter(
    tmp_path: Path,
    hub: FakeHub,
    dataset_rows: list[dict[str, Any]],
    resolved: bool | None,
    expected: list[int],
) -> None:
    out = tmp_path / "rows.jsonl"
    result = run(out, filters=dl.DownloadFilters(resolved=resolved))
    assert result.source_rows == expected
    assert written(out) == [dataset_rows[i] for i in expected]


def test_token_range_filter(tmp_path: Path, hub: FakeHub, dataset_rows: list[dict[str, Any]]) -> None:
    counter = TokenCounter(default_encoding=dl.TOKEN_ENCODING)
    tokens = [
        counter.count_request({"messages": row_messages(row), "tools": row_tools(row)}).total
        for row in dataset_rows
    ]
    low, high = 2000, 3000
    expected = [i for i, n in enumerate(tokens) if low <= n <= high]
    assert 0 < len(expected) < len(tokens)  # the fixture exercises both sides of the range

    out = tmp_path / "rows.jsonl"
    result = run(out, filters=dl.DownloadFilters(min_tokens=low, max_tokens=high))
    assert result.source_rows == expected
    assert manifest(out)["filters"] == {
        "resolved": None,
        "min_tokens": low,
        "max_tokens": high,
        "one_per_repo": False,
        "token_encoding": dl.TOKEN_ENCODING,
    }

    only_min = run(tmp_path / "min.jsonl", filters=dl.DownloadFilters(min_tokens=high))
    assert only_min.source_rows == [i for i, n in enumerate(tokens) if n >= high]


def test_one_per_repo(tmp_path: Path, hub: FakeHub, dataset_rows: list[dict[str, Any]]) -> None:
    out = tmp_path / "rows.jsonl"
    result = run(out, filters=dl.DownloadFilters(one_per_repo=True))
    assert result.source_rows == [0, 1, 7, 8]
    assert [r["repo"] for r in written(out)] == [
        "pandas-dev/pandas",
        "getmoto/moto",
        "python/mypy",
        "Project-MONAI/MONAI",
    ]
    assert manifest(out)["repos_taken"] == [r["repo"] for r in written(out)]

    unresolved = run(tmp_path / "u.jsonl", filters=dl.DownloadFilters(resolved=False, one_per_repo=True))
    assert unresolved.source_rows == [2]


def test_bad_arguments_are_refused_before_any_request(tmp_path: Path, hub: FakeHub) -> None:
    with pytest.raises(dl.DownloadError, match="at least 1"):
        run(tmp_path / "a.jsonl", limit=0)
    with pytest.raises(dl.DownloadError, match="larger than"):
        run(tmp_path / "b.jsonl", filters=dl.DownloadFilters(min_tokens=10, max_tokens=5))
    assert not hub.revision_route.called


# --------------------------------------------------------------------------- revision


def test_revision_mismatch_is_refused(tmp_path: Path, hub: FakeHub) -> None:
    hub.revision_info["sha"] = "0" * 40
    out = tmp_path / "rows.jsonl"
    with pytest.raises(dl.DownloadError, match="not the pinned 35455389ab51"):
        run(out)
    assert hub.reads == []
    assert not out.exists() and not dl.manifest_path(out).exists()


def test_unknown_revision_is_a_clear_error(tmp_path: Path, hub: FakeHub) -> None:
    hub.revision_route.mock(return_value=httpx.Response(404, json={"error": "Revision Not Found"}))
    with pytest.raises(dl.DownloadError, match="HTTP 404"):
        run(tmp_path / "rows.jsonl")


def test_falls_back_to_the_parquet_export_built_from_the_pin(
    tmp_path: Path, hub: FakeHub, dataset_rows: list[dict[str, Any]]
) -> None:
    hub.revision_info["siblings"] = [{"rfilename": ".gitattributes"}, {"rfilename": "data/train.jsonl"}]
    export = hub.router.get(EXPORT_URL, params={"dataset": dl.DATASET}).mock(
        return_value=httpx.Response(
            200, json=fixture_json("datasets_server_parquet.json"), headers={"X-Revision": PIN}
        )
    )
    out = tmp_path / "rows.jsonl"
    result = run(out)
    assert export.called
    assert result.source == "parquet-export"
    assert written(out) == dataset_rows
    assert [f["path"] for f in manifest(out)["files"]] == list(EXPORT_FILES)


def test_parquet_export_of_another_revision_is_refused(tmp_path: Path, hub: FakeHub) -> None:
    hub.revision_info["siblings"] = [{"rfilename": "README.md"}]
    hub.router.get(EXPORT_URL).mock(
        return_value=httpx.Response(
            200, json=fixture_json("datasets_server_parquet.json"), headers={"X-Revision": "1" * 40}
        )
    )
    with pytest.raises(dl.DownloadError, match="export is of revision '1111"):
        run(tmp_path / "rows.jsonl")
    assert hub.reads == []


# --------------------------------------------------------------------------- resume


def test_resume_after_an_interruption(
    tmp_path: Path, hub: FakeHub, dataset_rows: list[dict[str, Any]]
) -> None:
    def second_file_down(request: httpx.Request, path: str) -> httpx.Response | None:
        if path == FILES[1]:
            raise httpx.ConnectError("connection reset", request=request)
        return None

    hub.fault = second_file_down
    out = tmp_path / "rows.jsonl"
    with pytest.raises(dl.DownloadError, match="unreachable"):
        run(out)
    state = manifest(out)
    assert state["rows_taken"] == [0, 1, 2, 3, 4] and state["next_row"] == 5
    assert not state["complete"]
    assert written(out) == dataset_rows[:5]

    hub.fault = None
    hub.reads.clear()
    result = run(out)
    assert result.resumed and result.rows_added == 4 and result.rows_written == 9
    assert written(out) == dataset_rows  # no duplicates, nothing missing
    assert hub.files_read() == {FILES[1]}  # the finished first file is not fetched again


def test_resume_mid_row_group_drops_a_row_the_manifest_does_not_count(
    tmp_path: Path, hub: FakeHub, dataset_rows: list[dict[str, Any]]
) -> None:
    out = tmp_path / "rows.jsonl"
    run(out, limit=3)  # stops inside the second row group
    with out.open("ab") as handle:  # a crash after writing a row, before the manifest
        handle.write(b'{"instance_id": "half-writ')
    result = run(out, limit=6)
    assert result.resumed and result.rows_added == 3
    assert written(out) == dataset_rows[:6]
    assert manifest(out)["rows_taken"] == list(range(6))


def test_rerun_with_the_same_arguments_is_a_no_op(
    tmp_path: Path, hub: FakeHub, dataset_rows: list[dict[str, Any]]
) -> None:
    out = tmp_path / "rows.jsonl"
    run(out, limit=4)
    calls = hub.revision_route.call_count
    result = run(out, limit=4)
    assert result.resumed and result.complete and result.rows_added == 0
    assert hub.revision_route.call_count == calls  # already complete: no network at all
    assert written(out) == dataset_rows[:4]


def test_other_filters_are_refused_unless_restarted(tmp_path: Path, hub: FakeHub) -> None:
    out = tmp_path / "rows.jsonl"
    run(out, limit=2)
    with pytest.raises(dl.DownloadError, match="other filters"):
        run(out, limit=2, filters=dl.DownloadFilters(resolved=False))
    with pytest.raises(dl.DownloadError, match="more than --limit 1"):
        run(out, limit=1)
    result = run(out, limit=2, filters=dl.DownloadFilters(resolved=False), restart=True)
    assert not result.resumed and result.source_rows == [2, 3]
    assert [r["resolved"] for r in written(out)] == [False, False]


def test_an_existing_file_without_manifest_is_not_overwritten(tmp_path: Path, hub: FakeHub) -> None:
    out = tmp_path / "rows.jsonl"
    out.write_text("precious\n")
    with pytest.raises(dl.DownloadError, match="no manifest"):
        run(out)
    assert out.read_text() == "precious\n"
    assert run(out, limit=1, restart=True).rows_written == 1


# --------------------------------------------------------------------------- network


def test_retries_429_and_503_honouring_retry_after(tmp_path: Path, hub: FakeHub) -> None:
    hub.revision_route.side_effect = [
        httpx.Response(429, headers={"Retry-After": "7"}),
        httpx.Response(503),
        httpx.Response(200, json=hub.revision_info),
    ]
    failed: set[str] = set()

    def first_read_busy(request: httpx.Request, path: str) -> httpx.Response | None:
        if path not in failed:
            failed.add(path)
            return httpx.Response(503, headers={"Retry-After": "0"})
        return None

    hub.fault = first_read_busy
    waits: list[float] = []
    out = tmp_path / "rows.jsonl"
    result = run(out, limit=2, retry=dl.RetryPolicy(attempts=4, base_delay=1.5, sleep=waits.append))
    assert result.rows_written == 2
    assert waits == [7.0, 3.0, 0.0]  # Retry-After, then backoff (1.5 x 2), then Retry-After: 0


def test_gives_up_after_the_retry_budget(tmp_path: Path, hub: FakeHub) -> None:
    hub.revision_route.mock(return_value=httpx.Response(502))
    waits: list[float] = []
    with pytest.raises(dl.DownloadError, match=r"kept failing \(HTTP 502\) after 3 attempts"):
        run(tmp_path / "rows.jsonl", retry=dl.RetryPolicy(attempts=3, sleep=waits.append))
    assert waits == [1.0, 2.0]


def test_a_very_long_retry_after_is_reported_not_slept(tmp_path: Path, hub: FakeHub) -> None:
    hub.revision_route.mock(return_value=httpx.Response(429, headers={"Retry-After": "86400"}))
    with pytest.raises(dl.DownloadError, match="asks to wait 86400 s"):
        run(tmp_path / "rows.jsonl")


def test_unreachable_host_is_one_clear_line(
    tmp_path: Path, hub: FakeHub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    hub.revision_route.side_effect = httpx.ConnectError("[Errno -3] Temporary failure in name resolution")
    with pytest.raises(dl.DownloadError, match=r"^huggingface\.co unreachable \(ConnectError"):
        run(tmp_path / "rows.jsonl")

    monkeypatch.setattr(time, "sleep", lambda seconds: None)
    parser = argparse.ArgumentParser()
    dl.add_download_arguments(parser)
    code = dl.run_download_command(parser.parse_args(["--out", str(tmp_path / "cli.jsonl"), "--limit", "3"]))
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert lines[-1].startswith("error: huggingface.co unreachable (ConnectError")
    # before it, one note per retry; never a traceback
    assert len(lines) == 5
    assert all(line.startswith("download: huggingface.co: ConnectError") for line in lines[:-1])


def test_missing_pyarrow_is_a_clear_error(
    tmp_path: Path, hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # makes the import fail
    with pytest.raises(dl.DownloadError, match=r"pip install -e '\.\[download\]'"):
        run(tmp_path / "rows.jsonl")


# --------------------------------------------------------------------------- CLI helper


def test_cli_helper_parses_the_options_and_downloads(
    tmp_path: Path, hub: FakeHub, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cli.jsonl"
    parser = argparse.ArgumentParser()
    dl.add_download_arguments(parser)
    args = parser.parse_args(
        ["--out", str(out), "--limit", "5", "--resolved", "true", "--one-per-repo", "--max-tokens", "5000"]
    )
    assert dl.run_download_command(args) == 0
    assert [r["repo"] for r in written(out)] == [
        "pandas-dev/pandas",
        "getmoto/moto",
        "python/mypy",
        "Project-MONAI/MONAI",
    ]
    assert "4 rows (4 new)" in capsys.readouterr().err
    assert manifest(out)["filters"]["resolved"] is True

    assert dl.main(["--out", str(out), "--limit", "5", "--resolved", "false", "--quiet"]) == 1
    assert "other filters" in capsys.readouterr().err


def test_a_failure_inside_a_row_group_read_is_a_clear_error_and_resumable(
    tmp_path: Path, hub: FakeHub, dataset_rows: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dl, "TAIL_BYTES", 1024)
    seen: list[str] = []

    def third_read_fails(request: httpx.Request, path: str) -> httpx.Response | None:
        seen.append(path)
        if len(seen) == 4:  # tail, footer, first row group: fine; the second row group: down
            raise httpx.ReadTimeout("timed out", request=request)
        return None

    hub.fault = third_read_fails
    out = tmp_path / "rows.jsonl"
    with pytest.raises(dl.DownloadError, match=r"huggingface\.co unreachable \(ReadTimeout"):
        run(out, retry=dl.RetryPolicy(attempts=1))
    assert manifest(out)["next_row"] == 2
    hub.fault = None
    assert run(out).rows_added == 7
    assert written(out) == dataset_rows
