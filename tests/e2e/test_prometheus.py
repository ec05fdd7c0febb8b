"""A real Prometheus server (Debian's `prometheus`, installed by .ci/run) scrapes the proxy;
the expected series arrive with the expected values, read through Prometheus' query API."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.test_read_tool_output import history
from tests.fake_upstream import FakeUpstream, free_port
from tests.needs import service_binary

pytestmark = pytest.mark.e2e


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Any]:
    binary = service_binary("prometheus")
    started: list[subprocess.Popen[bytes]] = []

    def start(target_port: int) -> str:
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: compaction-proxy\n"
            f"    static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n"
        )
        log = (tmp_path / "prometheus.log").open("wb")
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        started.append(process)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/-/ready", timeout=1).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError((tmp_path / "prometheus.log").read_text())

    yield start
    for process in started:
        process.terminate()
        process.wait(10)


def query(url: str, promql: str, expected: float, timeout: float = 30.0) -> float:
    """The query's single value once it equals ``expected`` (scrapes run every second)."""
    deadline = time.monotonic() + timeout
    value = float("nan")
    while time.monotonic() < deadline:
        result = httpx.get(url + "/api/v1/query", params={"query": promql}).json()["data"]["result"]
        if result:
            value = float(result[0]["value"][1])
            if value == expected:
                print(f"prometheus: {promql} = {value:g}")  # shown with pytest -s
                return value
        time.sleep(0.5)
    raise AssertionError(f"{promql} = {value}, expected {expected}")


def test_prometheus_scrapes_the_expected_series(
    start_proxy: Any, upstream: FakeUpstream, prometheus: Any
) -> None:
    proxy = start_proxy({"context_windows": {"default": 8192}, "policy": "full"})
    url = prometheus(proxy.port)
    for _ in range(3):
        httpx.post(proxy.base_url + "/chat/completions", json={"model": "m", "messages": history()[:2]})
    response = httpx.post(
        proxy.base_url + "/chat/completions",
        json={"model": "m", "messages": history()},
        headers={"x-compaction-policy": "improved", "authorization": "Bearer sk-prom"},
    )
    saved = int(response.headers["x-compaction-tokens-before"]) - int(
        response.headers["x-compaction-tokens-after"]
    )
    httpx.post(proxy.base_url + "/chat/completions", content=b"not json")
    query(
        url,
        'compaction_proxy_requests_total{route="chat",policy="full",mode="enforce",status_class="2xx"}',
        3,
    )
    query(url, 'compaction_proxy_requests_total{route="chat",status_class="4xx"}', 1)
    # Offload, summarize (the whole request, the answer's reserve included, is brought to the
    # target) and verify guidance; five outputs and the summary's transcript saved.
    query(url, 'sum(compaction_proxy_compactions_total{policy="improved",trigger="threshold"})', 3)
    query(url, 'compaction_proxy_tokens_saved_total{policy="improved",mode="enforce"}', saved)
    query(url, 'compaction_proxy_outputs_offloaded_total{policy="improved"}', 6)
    query(url, 'compaction_proxy_context_tokens_before_count{policy="full"}', 3)
