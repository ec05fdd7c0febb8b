"""The serving process collects garbage rarely and never walks what exists at its start:
a request's parsed body is tens of thousands of short-lived containers, and CPython's default
threshold ran dozens of collections per request (about 15% of the CPU of an agent step under
load, benchmarks/load.py)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

CHECK = """
import gc
from proxy.serving import GC_YOUNG_THRESHOLD, tune_gc
before = gc.get_threshold()
tune_gc()
after = gc.get_threshold()
assert after == (GC_YOUNG_THRESHOLD, before[1], before[2]), (before, after)
assert gc.get_freeze_count() > 10_000, gc.get_freeze_count()
print("ok")
"""


def test_tune_gc_raises_the_young_threshold_and_freezes_the_start() -> None:
    # In a process of its own: the test runner's collector stays as it is.
    done = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


THREADS = """
import sys
from proxy.serving import GIL_SWITCH_SECONDS, tune_threads
assert sys.getswitchinterval() == 0.005
tune_threads()
assert abs(sys.getswitchinterval() - GIL_SWITCH_SECONDS) < 1e-9 and GIL_SWITCH_SECONDS < 0.005
print("ok")
"""


def test_tune_threads_hands_the_gil_to_a_waiting_thread_sooner() -> None:
    done = subprocess.run(
        [sys.executable, "-c", THREADS], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
