"""The deployment examples are consistent with the project: the compose file's proxy config
is valid, and Prometheus scrapes the port the proxy listens on."""

from __future__ import annotations

from pathlib import Path

import yaml

from proxy.config.settings import load_settings

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def test_compose_example_is_consistent() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    assert {"proxy", "redis", "prometheus", "grafana"} <= set(compose["services"])
    settings = load_settings(DEPLOY / "proxy-config.yml", env={})
    assert settings.store.backend == "redis" and settings.store.redis_url.startswith("redis://redis:")
    scrape = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert scrape["scrape_configs"][0]["static_configs"][0]["targets"] == [f"proxy:{settings.server.port}"]


def test_every_compose_service_is_checked_restarted_and_waited_for() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    for name, service in services.items():
        assert service["restart"] == "unless-stopped", name
        assert service["healthcheck"]["test"][0] == "CMD", name
        for dependency, condition in (service.get("depends_on") or {}).items():
            assert condition == {"condition": "service_healthy"}, (name, dependency)
            assert "healthcheck" in services[dependency]
    assert services["proxy"]["depends_on"] == {"redis": {"condition": "service_healthy"}}
    assert services["proxy"]["healthcheck"]["test"] == ["CMD", "compaction-proxy", "healthcheck"]


def test_the_image_checks_its_health_on_the_port_it_serves() -> None:
    dockerfile = (DEPLOY.parent / "Dockerfile").read_text()
    assert 'CMD ["compaction-proxy", "healthcheck"]' in dockerfile
    assert "8080/readyz" not in dockerfile  # no hard-coded port in the check
    assert "--port" not in dockerfile.split("CMD [")[-1]  # serve takes the configured port


def test_the_build_context_leaves_out_virtualenvs_and_state() -> None:
    import fnmatch

    rules = [
        line
        for line in (DEPLOY.parent / ".dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]

    def included(path: str) -> bool:
        keep = False
        for rule in rules:
            negated = rule.startswith("!")
            pattern = rule.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
                keep = negated
        return keep

    for needed in ("pyproject.toml", "README.md", "config.yml", "proxy/app.py", "policies/pipeline.py"):
        assert included(needed), needed
    for left_out in (".venv/bin/python", "var/compaction.db", ".venv-model/x", "tests/x.py", ".git/HEAD"):
        assert not included(left_out), left_out
