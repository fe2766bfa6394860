"""The service's launcher, `python -m service` (what `perfmodel serve` runs): the scheduler-facing HTTP service on
uvicorn. Every option falls back to its `PERFMODEL_*` environment variable (see service/settings.py), then to the
default: 127.0.0.1:8000, one worker, the SQLite store under PERFMODEL_HOME and the shipped models. Bad options exit
with code 2 and one line on stderr."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

if TYPE_CHECKING:
    from service.settings import ServiceSettings

Opt = typer.Option


def serve(
        host: Annotated[Optional[str], Opt(help="address to listen on (env PERFMODEL_HOST, 127.0.0.1)")] = None,
        port: Annotated[Optional[int], Opt(help="TCP port (env PERFMODEL_PORT, 8000)")] = None,
        workers: Annotated[Optional[int], Opt(help="worker processes (env PERFMODEL_WORKERS, 1)")] = None,
        store: Annotated[Optional[str], Opt("--store", help="store URL (env PERFMODEL_STORE_URL, SQLite under "
                                                             "PERFMODEL_HOME)")] = None,
        models_dir: Annotated[Optional[Path], Opt(help="model registry (env PERFMODEL_MODELS_DIR, the shipped "
                                                       "models/)")] = None,
        model_version: Annotated[Optional[str], Opt(help="NAME/VERSION to serve instead of the promoted model "
                                                         "of its role (env PERFMODEL_MODEL_VERSION)")] = None,
        log_level: Annotated[Optional[str], Opt(help="uvicorn log level (env PERFMODEL_LOG_LEVEL, info)")] = None,
        access_log: Annotated[bool, Opt(help="log every request (costs throughput)")] = False,
        allow_open_writes: Annotated[bool, Opt("--allow-open-writes", help="serve on a non-loopback address "
                                               "with no write token (anyone who reaches it may register jobs, post "
                                               "observations, promote models; env PERFMODEL_ALLOW_OPEN_WRITES)")
                                     ] = False,
        hash_token: Annotated[Optional[str], Opt("--hash-token", metavar="TOKEN",
                                                 help="print the SHA-256 of TOKEN (for PERFMODEL_TOKEN_SHA256) "
                                                      "and exit")] = None,
) -> None:
    """Serve predictions over HTTP (API v1; docs at /docs). Writes need a bearer token whose SHA-256 is in
    PERFMODEL_TOKEN_SHA256 (comma-separated); with none configured, writes are open, which only a loopback host
    (the default) or --allow-open-writes allows."""
    from pydantic import ValidationError

    from perfmodel.core.errors import PerfmodelError
    from service.settings import ServiceSettings
    from service.settings import hash_token as sha256_of

    if hash_token is not None:
        typer.echo(sha256_of(hash_token))
        return
    overrides: dict[str, Any] = {"host": host, "port": port, "workers": workers, "store_url": store,
                                 "models_dir": models_dir, "model_version": model_version, "log_level": log_level}
    if allow_open_writes:
        overrides["allow_open_writes"] = True
    overrides = {k: v for k, v in overrides.items() if v is not None}
    try:
        settings = ServiceSettings(**overrides)
        run(settings, overrides, access_log=access_log)
    except (PerfmodelError, ValidationError) as exc:
        typer.echo("error: " + " ".join(str(exc).split()), err=True)
        raise typer.Exit(2) from None


def run(settings: ServiceSettings, overrides: dict[str, Any], *, access_log: bool = False) -> None:
    """Refuse an open server beyond loopback, then run uvicorn with the header limit: httptools counting header
    bytes (`service.limits.BoundedHttpToolsProtocol`), and h11's own limit where h11 is used."""
    import uvicorn

    from service.app import create_app
    from service.launch import refuse_open_writes
    from service.limits import BoundedHttpToolsProtocol, HttpToolsProtocol

    refuse_open_writes(settings)
    BoundedHttpToolsProtocol.max_header_bytes = settings.max_header_bytes
    common: dict[str, Any] = dict(
        host=settings.host, port=settings.port, log_level=settings.log_level, access_log=access_log,
        server_header=False, http=BoundedHttpToolsProtocol if HttpToolsProtocol is not None else "h11",
        h11_max_incomplete_event_size=settings.max_header_bytes, timeout_graceful_shutdown=settings.shutdown_grace_s)
    if settings.workers == 1:
        uvicorn.run(create_app(settings), **common)
        return
    # each worker process builds its own app from the environment: hand the options on through it
    for name, value in overrides.items():
        os.environ[f"PERFMODEL_{name.upper()}"] = str(value)
    sys.stdout.flush()
    uvicorn.run("service.app:app_from_env", factory=True, workers=settings.workers, **common)


app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
app.command()(serve)


def main() -> None:
    """`python -m service [OPTIONS]` (and `perfmodel serve [OPTIONS]`, which runs it)."""
    app(prog_name="perfmodel serve")
