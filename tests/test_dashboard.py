"""The Grafana dashboard only refers to metrics the proxy exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from proxy.telemetry.metrics import Metrics

ROOT = Path(__file__).resolve().parent.parent


def test_every_dashboard_metric_is_exported() -> None:
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "compaction-proxy.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    used = {m for e in exprs for m in re.findall(r"compaction_proxy_[a-z_]+", e)}
    exported: set[str] = set()
    suffixes_by_type = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    for family in Metrics().registry.collect():
        suffixes = suffixes_by_type.get(family.type, ("",))
        exported.update(family.name + s for s in suffixes)
    assert used and used <= exported, used - exported
    assert {"compaction_proxy_tokens_saved_total", "compaction_proxy_shadow_compares_total"} <= used
    assert {"compaction_proxy_canary_requests_total", "compaction_proxy_canary_paused"} <= used
