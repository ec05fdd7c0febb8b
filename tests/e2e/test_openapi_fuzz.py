"""schemathesis fuzzes the proxy's own HTTP API from the OpenAPI document it serves
(health, readiness, metrics, compaction events): never a server error."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

pytestmark = pytest.mark.e2e


def test_api_never_fails_on_generated_requests(shared_proxy: Any) -> None:
    schema = schemathesis.openapi.from_url(shared_proxy.url + "/schema/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    paths = {operation.path for operation in operations}
    assert {"/healthz", "/readyz", "/metrics", "/v1/compaction/events"} <= paths
    calls = 0
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def call(case: Any) -> None:
            nonlocal calls
            response = case.call(headers={"authorization": "Bearer sk-fuzz"})
            calls += 1
            assert response.status_code < 500, (case.path, case.query, response.text[:200])

        call()
    assert calls >= 40
