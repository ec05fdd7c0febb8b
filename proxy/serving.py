"""What uvicorn runs: the HTTP protocol with the proxy's connection limits, and the app of
one worker process when ``server.workers`` > 1 (its factory, configured from the
environment ``serve`` sets)."""

from __future__ import annotations

import gc
import importlib.util
import os
import sys
from typing import Any

import orjson

from proxy.app import ProxyApp, create_app
from proxy.config.settings import Settings, load_settings
from proxy.telemetry.logs import configure_logging


def http_protocol(settings: Settings) -> Any:
    """uvicorn's httptools protocol with header size and read deadlines (h11 if httptools is
    missing: it bounds the headers' size only)."""
    if not importlib.util.find_spec("httptools"):
        return "h11"
    from proxy.edge.server_protocol import LimitedHttpToolsProtocol

    server = settings.server
    LimitedHttpToolsProtocol.configure(
        max_header_bytes=server.max_header_bytes,
        header_timeout=server.header_timeout_seconds,
        body_timeout=server.body_timeout_seconds,
    )
    return LimitedHttpToolsProtocol


# Allocations between collections of the youngest generation. A request parses a body into
# tens of thousands of containers that die with it: at CPython's default of 700, each request
# runs dozens of collections that find nothing to free, and every few of them also walk
# the older generations, whose size grows with the sessions the proxy keeps.
GC_YOUNG_THRESHOLD = 50_000


def tune_gc() -> None:
    """Collect rarely, and never walk what exists at start (imports, settings, the app's
    graph: it lives as long as the process) again: ``gc.freeze`` moves it out of reach."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


# How long the event loop's thread may hold the GIL while the store's thread waits for it
# (CPython's default is 5 ms). A compaction point awaits the store (its offloaded outputs are
# written before the view naming them is sent), and each of a store job's few GIL
# acquisitions waited up to the whole interval while the loop kept busy: under 200 sessions
# whose points fall together, the 99th percentile of a step was 150-500 ms longer at 5 ms
# than at 0.5 ms, for the same CPU (benchmarks/RESULTS.md, section 20).
GIL_SWITCH_SECONDS = 0.0005


def tune_threads() -> None:
    """Hand the GIL to a waiting thread (the store's) after ``GIL_SWITCH_SECONDS``."""
    sys.setswitchinterval(GIL_SWITCH_SECONDS)


def app_from_environment() -> ProxyApp:
    """The app of one worker process when ``server.workers`` > 1 (uvicorn's factory)."""
    overrides = orjson.loads(os.environ.get("COMPACTION_PROXY_OVERRIDES", "{}"))
    settings = load_settings(overrides=overrides)
    configure_logging(settings.logging.level, settings.logging.format)
    http_protocol(settings)  # this worker's connection limits
    app = create_app(settings)
    tune_gc()
    tune_threads()
    return app
