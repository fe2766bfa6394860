"""Nothing slow runs on the event loop: the app is driven through httpx's ASGI transport on an asyncio loop in
debug mode with `slow_callback_duration` 50 ms, and every request that captures a graph, registers a job, loads a
model or recalibrates after a promotion must leave no "Executing ... took" warning behind. Each route is called
once with an invalid body first: FastAPI builds a route's dependencies and models on its first match (~25 ms per
route, once per process), which is not what this test is about."""

from __future__ import annotations

import asyncio
import logging

import httpx

from service.app import create_app
from service.settings import ServiceSettings
from tests.conftest import copy_shipped_models

SLOW_CALLBACK_S = 0.05


class _Slow(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.active = False

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if self.active and message.startswith("Executing") and " took " in message:
            self.messages.append(message)


async def _scenario(app, slow: _Slow) -> dict[str, int]:
    statuses: dict[str, int] = {}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=600) as client:
            for path in ("/v1/jobs", "/v1/predict", "/v1/observations", "/v1/predict/matrix",
                         "/v1/models/none/v1/promote"):  # each route built once (see the module docstring)
                assert (await client.post(path, json={})).status_code in (404, 422)
            slow.active = True
            spec = {"source": {"kind": "zoo", "name": "mlp-recommender"}, "batch_size": 4}
            registered = await client.post("/v1/jobs", json=spec)  # a capture
            statuses["register"] = registered.status_code
            job = registered.json()["job_id"]
            t4 = {"job": job, "placement": {"accelerator": "t4"}}
            first = await client.post("/v1/predict", json=t4)  # the per-op model, first time
            statuses["predict"] = first.status_code
            raw = first.json()["throughput_samples_per_s"]
            observed = await client.post("/v1/observations", json={**t4, "throughput_samples_per_s": raw * 0.8})
            statuses["observe"] = observed.status_code
            statuses["promote"] = (await client.post("/v1/models/xgb-device-ops/v2/promote")).status_code
            after = await client.post("/v1/predict", json=t4)  # recalibration against the new model
            statuses["after_promotion"] = after.status_code
            statuses["calibrated"] = int(after.json()["calibrated"])
            matrix = await client.post("/v1/predict/matrix", json={"jobs": [job], "grid": {
                "accelerators": ["t4", "a100-sxm4-80gb"], "device_counts": [1, 2]}})
            statuses["matrix"] = matrix.status_code
            for _ in range(20):  # the warm path, on the loop
                statuses["warm"] = (await client.post("/v1/predict", json=t4)).status_code
            slow.active = False
    return statuses


def test_captures_registrations_promotions_and_recalibration_never_stall_the_loop(tmp_path):
    copy_shipped_models(tmp_path / "models")
    app = create_app(ServiceSettings(store_url=f"sqlite:///{tmp_path / 'store.db'}", models_dir=tmp_path / "models",
                                     sync_interval_s=0))
    slow = _Slow()
    logger = logging.getLogger("asyncio")
    logger.addHandler(slow)
    loop = asyncio.new_event_loop()
    loop.set_debug(True)
    loop.slow_callback_duration = SLOW_CALLBACK_S
    try:
        statuses = loop.run_until_complete(_scenario(app, slow))
    finally:
        loop.close()
        logger.removeHandler(slow)
    assert statuses == {"register": 201, "predict": 200, "observe": 201, "promote": 200, "after_promotion": 200,
                        "calibrated": 1, "matrix": 200, "warm": 200}
    assert slow.messages == []
