"""``replay.download`` and the Hub (``fake_hub.py``): it reads only the pinned revision (its
own parquet files, else a parquet export built from it), retries what is worth retrying, and
reports every failure as one clear line."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from replay import download as dl
from tests.replay.fake_hub import EXPORT_FILES, EXPORT_URL, PIN, FakeHub, fixture_json, manifest, run, written

pytest.importorskip("pyarrow.parquet")


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
