"""``replay.download`` resumes from its manifest (``fake_hub.py``): after an interruption it
continues where it stopped without duplicating or losing a row, a finished file is not fetched
again, and a run with other arguments is refused unless restarted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from replay import download as dl
from replay.download import remote_file
from tests.replay.fake_hub import FILES, FakeHub, manifest, run, written

pytest.importorskip("pyarrow.parquet")


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


def test_a_failure_inside_a_row_group_read_is_a_clear_error_and_resumable(
    tmp_path: Path, hub: FakeHub, dataset_rows: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote_file, "TAIL_BYTES", 1024)
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
