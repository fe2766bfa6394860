"""The FastAPI application: `create_app(settings)`. Nothing is loaded at import or in `create_app`: the store is
opened and the models are loaded in the lifespan, when a server starts the app.

    uvicorn --factory service.app:app_from_env      # what `perfmodel serve --workers N` runs in each worker

The API docs (/docs: Swagger UI, /redoc: ReDoc) work offline: their JavaScript and CSS are served by the service
itself (`DOCS_ASSETS_URL`, from the `fastapi-offline` package), never fetched from a CDN.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

import perfmodel
from service import errors
from service.fastpath import PredictFastPath
from service.limits import LimitsMiddleware
from service.metrics import Metrics, MetricsMiddleware
from service.routers import accelerators, health, jobs, models, observations, predict
from service.settings import ServiceSettings
from service.state import ServiceState, open_state, settle_heap

log = logging.getLogger("perfmodel.service")

# How long a thread holding the GIL runs before one waiting for it gets it (CPython's default: 5 ms). The event loop
# waits that long each time it takes the GIL back from a worker thread doing Python work (a job's IR parsed and its
# graph built, a matrix, a slow prediction): at 1 ms predictions keep being answered while jobs are registered (with
# two clients registering Llama-7B and GPT-2 IRs back to back, predict p99 50 ms at 1 ms against 83 ms at 5 ms, the
# other fixes of `service.state.growing_heap` and `core.canonical` not yet in), at a few per cent of the workers' speed.
GIL_SWITCH_INTERVAL_S = 0.001

DESCRIPTION = """\
What throughput will job X reach on placement Y? Register a job once (`POST /v1/jobs`), then ask for predictions
(`POST /v1/predict`, `POST /v1/predict/matrix`) as often as the scheduler likes, and tell the service what running
jobs measured (`POST /v1/observations`): later predictions for those jobs are calibrated by it.

Writes (jobs, observations, promotions) need a bearer token when the server has any configured
(`PERFMODEL_TOKEN_SHA256`); reads need one only with `PERFMODEL_READ_REQUIRES_TOKEN=true`.
"""


async def _keep_in_sync(state: ServiceState, interval_s: float, stop: asyncio.Event) -> None:
    """Every `interval_s`, pick up what other workers wrote. A failed round (the store down, say) is logged and the
    next one tries again: the loop only ends when `stop` is set (the app stops), after the round in flight, so that
    no round still reads the store once it is closed (cancelling would leave that round running in its thread)."""
    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):  # the builtin TimeoutError only from Python 3.11
            await asyncio.wait_for(stop.wait(), interval_s)
        if stop.is_set():
            return
        try:
            await run_in_threadpool(state.sync_once)
        except Exception as exc:  # a store hiccup: try again next time
            why = errors.store_unavailable(exc)
            if why is not None:  # one line per round while the store is away, not a traceback each time
                log.warning("sync with the store failed: the store is unavailable (%s: %s); retrying in %s s",
                            why, type(exc).__name__, interval_s)
            else:
                log.exception("sync with the store failed")


def _prestart_captures() -> None:
    from perfmodel.graph.capture import prestart

    try:
        prestart()
    except Exception:  # the first capture tries again, and reports what fails
        log.exception("the graph-capture fork server did not start")


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
        log.info("serving %s from %s", state.engine.model_versions, state.store)
        if settings.capture_prestart:
            threading.Thread(target=_prestart_captures, name="perfmodel-capture-prestart", daemon=True).start()
        settle_heap()
        switch_interval_s = sys.getswitchinterval()
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        stop = asyncio.Event()
        task = (asyncio.create_task(_keep_in_sync(state, settings.sync_interval_s, stop))
                if settings.sync_interval_s else None)
        try:
            yield
        finally:
            stop.set()
            if task is not None:
                await task  # the round in flight ends before the store closes
            state.store.close()
            sys.setswitchinterval(switch_interval_s)

    telemetry = settings.opentelemetry
    app = FastAPI(title="perfmodel", version=perfmodel.__version__, description=DESCRIPTION, lifespan=lifespan,
                  docs_url=None, redoc_url=None,
                  telemetry={"tracing": telemetry, "metrics": telemetry, "logs": telemetry})
    errors.install(app)
    for module in (jobs, predict, observations, accelerators, models, health):
        app.include_router(module.router)
    install_docs(app)
    app.add_middleware(PredictFastPath, owner=app)  # innermost: behind the limits, counted by the metrics
    app.add_middleware(LimitsMiddleware, settings=settings)
    app.add_middleware(MetricsMiddleware, metrics=metrics)  # outermost: times and counts every response
    return app


DOCS_ASSETS_URL = "/docs-assets"


def docs_assets_dir() -> str:
    """Swagger UI's and ReDoc's JavaScript and CSS, as the `fastapi-offline` package ships them."""
    import fastapi_offline

    return str(Path(fastapi_offline.__file__).parent / "static")


def install_docs(app: FastAPI) -> None:
    """/docs (Swagger UI) and /redoc (ReDoc) with every asset served from `DOCS_ASSETS_URL`: they render on a
    cluster without internet access."""
    app.mount(DOCS_ASSETS_URL, StaticFiles(directory=docs_assets_dir()), name="docs-assets")
    redirect_url = app.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} - Swagger UI",
                                   oauth2_redirect_url=f"{root}{redirect_url}",
                                   swagger_js_url=f"{root}{DOCS_ASSETS_URL}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{root}{DOCS_ASSETS_URL}/swagger-ui.css",
                                   swagger_favicon_url=f"{root}{DOCS_ASSETS_URL}/favicon.png")

    @app.get(redirect_url, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} - ReDoc",
                              redoc_js_url=f"{root}{DOCS_ASSETS_URL}/redoc.standalone.js",
                              redoc_favicon_url=f"{root}{DOCS_ASSETS_URL}/favicon.png", with_google_fonts=False)


def app_from_env() -> FastAPI:
    """The app with settings from the environment (`PERFMODEL_*`): the factory each uvicorn worker calls."""
    return create_app(ServiceSettings())
