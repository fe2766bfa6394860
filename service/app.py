"""The FastAPI application: `create_app(settings)`. Nothing is loaded at import or in `create_app`: the store is
opened and the models are loaded in the lifespan, when a server starts the app.

    uvicorn --factory service.app:app_from_env      # what `perfmodel serve --workers N` runs in each worker
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

import perfmodel
from service import errors
from service.limits import BodyLimitMiddleware
from service.metrics import Metrics, MetricsMiddleware
from service.routers import accelerators, health, jobs, models, observations, predict
from service.settings import ServiceSettings
from service.state import ServiceState

log = logging.getLogger("perfmodel.service")

DESCRIPTION = """\
What throughput will job X reach on placement Y? Register a job once (`POST /v1/jobs`), then ask for predictions
(`POST /v1/predict`, `POST /v1/predict/matrix`) as often as the scheduler likes, and tell the service what running
jobs measured (`POST /v1/observations`): later predictions for those jobs are calibrated by it.

Writes (jobs, observations, promotions) need a bearer token when the server has any configured
(`PERFMODEL_TOKEN_SHA256`); reads need one only with `PERFMODEL_READ_REQUIRES_TOKEN=true`.
"""


def open_state(settings: ServiceSettings, metrics: Metrics) -> ServiceState:
    """Open the store and load the models (blocking). Raises if either fails: the server does not start."""
    from perfmodel.predictor.placed import PlacementPredictor
    from perfmodel.store.jobs import JobStore

    store = JobStore(settings.resolved_store_url())
    try:
        predictor = PlacementPredictor.load(settings.models_dir, settings.model_version)
        return ServiceState(settings, store, predictor, metrics)
    except BaseException:
        store.close()
        raise


async def _keep_in_sync(state: ServiceState, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await run_in_threadpool(state.sync_once)
        except Exception:  # a store hiccup: try again next time
            log.exception("sync with the store failed")


def create_app(settings: ServiceSettings | None = None) -> FastAPI:
    settings = settings if settings is not None else ServiceSettings()
    metrics = Metrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = await run_in_threadpool(open_state, settings, metrics)
        app.state.service = state
        if settings.writes_open:
            log.warning("no write token configured (PERFMODEL_TOKEN_SHA256): anyone who reaches %s may register "
                        "jobs, post observations and promote models", settings.host)
        log.info("serving %s from %s", state.predictor.model_versions, state.store)
        task = asyncio.create_task(_keep_in_sync(state, settings.sync_interval_s)) if settings.sync_interval_s else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            state.store.close()

    app = FastAPI(title="perfmodel", version=perfmodel.__version__, description=DESCRIPTION, lifespan=lifespan)
    errors.install(app)
    for module in (jobs, predict, observations, accelerators, models, health):
        app.include_router(module.router)
    app.add_middleware(BodyLimitMiddleware, max_request_bytes=settings.max_request_bytes,
                       max_multipart_bytes=settings.max_onnx_bytes)
    app.add_middleware(MetricsMiddleware, metrics=metrics)  # outermost: times and counts every response
    return app


def app_from_env() -> FastAPI:
    """The app with settings from the environment (`PERFMODEL_*`): the factory each uvicorn worker calls."""
    return create_app(ServiceSettings())
