"""The pinned dataset and where its rows live: the Hub API names the commit and its parquet
files; only if the commit holds none does the datasets-server parquet export serve, and then
only when that export was built from the pinned commit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import orjson

from replay.download.errors import DownloadError
from replay.download.retrying_http import RetryingHttp

DATASET = "nebius/SWE-rebench-openhands-trajectories"
REVISION = "35455389ab51bf5e2306bfd436ef72d0f98bf882"
HUB_ENDPOINT = "https://huggingface.co"
DATASETS_SERVER = "https://datasets-server.huggingface.co"


@dataclass(frozen=True, slots=True)
class SourceFile:
    path: str
    url: str


@dataclass(frozen=True, slots=True)
class Source:
    kind: str  # "revision-files" | "parquet-export"
    files: tuple[SourceFile, ...]


def _resolve_url(endpoint: str, dataset: str, revision: str, path: str) -> str:
    return f"{endpoint}/datasets/{dataset}/resolve/{revision}/{quote(path)}"


def find_source(
    http: RetryingHttp, endpoint: str, datasets_server: str, dataset: str, revision: str
) -> Source:
    """The parquet files of ``dataset@revision``; refuses anything of another revision."""
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
        return Source(
            "revision-files",
            tuple(SourceFile(p, _resolve_url(endpoint, dataset, revision, p)) for p in paths),
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
    return Source(
        "parquet-export",
        tuple(SourceFile(f"{config}/{split}/{name}", url) for config, split, name, url in files),
    )


def _json(response: httpx.Response) -> Any:
    try:
        return orjson.loads(response.content)
    except orjson.JSONDecodeError:
        raise DownloadError(f"{response.request.url} did not answer JSON") from None
