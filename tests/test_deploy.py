"""The deployment examples are consistent with the project: the compose file's proxy config
is valid, and Prometheus scrapes the port the proxy listens on."""

from __future__ import annotations

from pathlib import Path

import yaml

from proxy.settings import load_settings

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def test_compose_example_is_consistent() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    assert {"proxy", "redis", "prometheus", "grafana"} <= set(compose["services"])
    settings = load_settings(DEPLOY / "proxy-config.yml", env={})
    assert settings.store.backend == "redis" and settings.store.redis_url.startswith("redis://redis:")
    scrape = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert scrape["scrape_configs"][0]["static_configs"][0]["targets"] == [f"proxy:{settings.server.port}"]
