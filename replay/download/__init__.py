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
``replay/recording/rows.py``): every column of the dataset, nothing added. Progress lives in a sidecar
``<out>.manifest.json``: the pinned revision, the filters, the source row numbers taken and the
next source row to read. An interrupted run continues where it stopped; a run with other
filters refuses unless told to ``restart``.

Reading parquet needs ``pyarrow`` (``pip install -e '.[download]'``), imported only in
``resumable``, on first use.

The modules, lowest first: ``errors``; ``retrying_http`` (GETs with retries and backoff);
``hub`` (the pinned dataset, and which parquet files hold its rows); ``remote_file`` (a parquet
file read by HTTP range requests); ``filters`` (which rows to keep); ``manifest`` (the resumable
state); ``resumable`` (``download()``); ``command`` (the command line).
"""

from __future__ import annotations

from replay.download.command import add_download_arguments, main, run_download_command
from replay.download.errors import DownloadError
from replay.download.filters import TOKEN_ENCODING, DownloadFilters
from replay.download.hub import DATASET, DATASETS_SERVER, HUB_ENDPOINT, REVISION
from replay.download.manifest import MANIFEST_VERSION, DownloadResult, manifest_path
from replay.download.remote_file import TAIL_BYTES
from replay.download.resumable import download
from replay.download.retrying_http import RETRY_STATUSES, RetryPolicy

__all__ = [
    "DATASET",
    "DATASETS_SERVER",
    "HUB_ENDPOINT",
    "MANIFEST_VERSION",
    "RETRY_STATUSES",
    "REVISION",
    "TAIL_BYTES",
    "TOKEN_ENCODING",
    "DownloadError",
    "DownloadFilters",
    "DownloadResult",
    "RetryPolicy",
    "add_download_arguments",
    "download",
    "main",
    "manifest_path",
    "run_download_command",
]
