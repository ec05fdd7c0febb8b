"""``replay.download`` against the fake Hub (``fake_hub.py``): the rows it writes, how it pages
through the parquet files, its filters and its command-line helper. The source checks, the
network and the resume are in ``test_download_hub.py`` and ``test_download_resume.py``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from policies.tokens import TokenCounter
from replay import download as dl
from replay.download import remote_file
from replay.recording.rows import row_messages, row_tools
from tests.replay.fake_hub import FILES, PIN, FakeHub, manifest, run, written

pytest.importorskip("pyarrow.parquet")


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
    monkeypatch.setattr(remote_file, "TAIL_BYTES", 1024)  # smaller than the fixture's footer
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
