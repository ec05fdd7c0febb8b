"""The control plane's cost to the data plane: one tenant with 3,000 events polls the
sessions list from 20 clients while another tenant's compacting requests are timed, against
their time at rest, in one run (``tests/e2e/test_control_plane_load.py`` asserts the paced
case within 1.5x). Everything runs on 127.0.0.1; the proxy and the fake upstream are stopped
at the end.

    .venv/bin/python benchmarks/control_plane.py --reps 3

Two loads: ``paced`` (each client asks again 100 ms after its answer) and ``back to back``
(no pause: on a 2-core box this saturates the proxy's HTTP handling even on ``/healthz``, so
its ratio is the server's, not the store's). The report gives each ratio, loaded / at rest.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [p for p in (str(HERE.parent),) if p not in sys.path]

from tests.conftest import ProxyProcess  # noqa: E402
from tests.e2e.test_control_plane_load import (  # noqa: E402
    CONFIG,
    EVENTS,
    PAUSE,
    fill,
    poller_tenant,
    side_by_side,
)
from tests.fake_upstream import FakeUpstream  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    upstream = FakeUpstream().start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            state = Path(tmp) / "state"
            fill(state / "compaction.db", poller_tenant(), EVENTS)
            config = {**CONFIG, "upstream": {"base_url": upstream.base_url}}
            proxy = ProxyProcess(config, Path(tmp), state_dir=state).start()
            try:
                print("| load | rest ms | loaded ms | ratio | polls |")
                print("| --- | --- | --- | --- | --- |")
                for name, pause in (("paced", PAUSE), ("back to back", 0.0)):
                    ratios = []
                    for _ in range(args.reps):
                        rest, loaded, polls = side_by_side(proxy, pause=pause)
                        ratios.append(loaded / rest)
                        figures = f"{rest * 1e3:.1f} | {loaded * 1e3:.1f} | {loaded / rest:.2f}x"
                        print(f"| {name} | {figures} | {len(polls)} |")
                    print(f"| {name}: median ratio | | | {statistics.median(ratios):.2f}x | |")
            finally:
                proxy.stop()
    finally:
        upstream.stop()


if __name__ == "__main__":
    main()
