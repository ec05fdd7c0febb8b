"""compaction-proxy: the HTTP side. Its packages, in the order a request meets them, are
described in ``proxy/README.md``."""

from __future__ import annotations

import importlib.metadata


def package_version() -> str:
    try:
        return importlib.metadata.version("compaction-proxy")
    except importlib.metadata.PackageNotFoundError:
        return "0"
