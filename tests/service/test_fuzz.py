"""A bounded schemathesis run against /openapi.json: whatever it sends, the service never answers 5xx."""

from __future__ import annotations

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings

from service.app import create_app
from service.settings import ServiceSettings
from tests.conftest import copy_shipped_models

EXAMPLES_PER_OPERATION = 30


@pytest.fixture(scope="module")
def fuzzed_app(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    copy_shipped_models(root / "models")
    app = create_app(ServiceSettings(store_url=f"sqlite:///{root / 'store.db'}", models_dir=root / "models",
                                     sync_interval_s=0, max_request_bytes=256 * 1024))
    with TestClient(app) as client:  # runs the lifespan: store and models loaded for every call below
        client.post("/v1/jobs", json={"source": {"kind": "zoo", "name": "mlp-recommender"}, "batch_size": 8})
        yield app


@pytest.mark.slow  # hundreds of generated requests
def test_no_request_gets_a_server_error(fuzzed_app):
    """Every documented operation, EXAMPLES_PER_OPERATION generated requests each (valid and invalid ones)."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzzed_app)
    server_errors: list[tuple] = []
    statuses: list[int] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 12
    for operation in operations:
        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def run(case):
            response = case.call()
            statuses.append(response.status_code)
            if response.status_code >= 500:
                server_errors.append((case.method, case.path, case.body, response.status_code,
                                      response.text[:300]))

        run()
    assert server_errors == []
    assert len(statuses) >= 5 * len(operations) and {200, 422} <= set(statuses)  # it did reach the handlers
