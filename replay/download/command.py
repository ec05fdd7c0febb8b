"""Download rows of the pinned ``nebius/SWE-rebench-openhands-trajectories`` revision.

The command line: the options of ``compaction-proxy replay download`` (also
``python -m replay.download``) and running them, with failures as one ``error:`` line.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from replay.download.errors import DownloadError
from replay.download.filters import TOKEN_ENCODING, DownloadFilters
from replay.download.hub import DATASET, HUB_ENDPOINT
from replay.download.resumable import download


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
