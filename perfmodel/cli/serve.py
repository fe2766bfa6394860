"""`perfmodel serve [OPTIONS]`: the HTTP service. The launcher lives with the service (service/cli.py, `python -m
service`), which the library never imports: this command replaces the process with `python -m service`, passing
every argument through (`perfmodel serve --help` is the service's help), so exit codes and signals are the
service's own."""

from __future__ import annotations

import os
import sys

import typer

# the service's options are its own: typer passes whatever follows `serve` through untouched
CONTEXT_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True}


def service_argv(args: list[str]) -> list[str]:
    """The command line that runs the service with `args`, on this interpreter. `-P` (Python 3.11+) keeps a
    `service` folder in the working directory from shadowing the installed one."""
    isolated = ["-P"] if sys.version_info >= (3, 11) else []
    return [sys.executable, *isolated, "-m", "service", *args]


def serve(ctx: typer.Context) -> None:
    """Serve predictions over HTTP (API v1; docs at /docs); `perfmodel serve --help` for its options."""
    sys.stdout.flush()
    sys.stderr.flush()
    argv = service_argv(list(ctx.args))
    os.execv(argv[0], argv)
