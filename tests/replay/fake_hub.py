"""A recorded-shape Hugging Face Hub for the ``replay.download`` tests (respx; no network).

The Hub API answers come from ``tests/fixtures/hf/*.json``; the dataset's parquet files are
written at test time from ``tests/fixtures/hf/rows.jsonl`` (nine rows, two files, two rows per
row group, see ``conftest.py``) and served with HTTP range requests behind a redirect, as
``resolve/`` URLs are.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import respx

from replay import download as dl
from replay.recording.rows import iter_rows

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


def run(out: Path, limit: int = 100, **kwargs: Any) -> dl.DownloadResult:
    kwargs.setdefault("retry", NO_RETRY_WAIT)
    return dl.download(out, limit=limit, progress=False, **kwargs)


def manifest(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(dl.manifest_path(out).read_text())
    return data


def written(out: Path) -> list[dict[str, Any]]:
    return list(iter_rows(out))
