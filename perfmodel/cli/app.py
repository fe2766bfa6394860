"""The `perfmodel` command line (typer): the root app and its command groups, one module each. Every user error is
one line on stderr and exit code 2 (`perfmodel.cli.common.user_errors`).

    zoo.py        zoo list, graph
    profile.py    profile (locally or on Ray: perfmodel/store/profiling.py)
    profiles.py   profiles list|show|export|import|ops-summary
    importing.py  import
    hw.py         hw list|show|probe|add|bench, adapt
    train.py      train, train-ops, evaluate, retrain
    models.py     models list|promote
    predict.py    predict, predict-ops
    export.py     export gavel
    report.py     report gpu-accuracy
    serve.py      serve (runs `python -m service`, service/cli.py)
"""

from __future__ import annotations

from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

from perfmodel.cli import export, hw, importing, models, predict, profile, profiles, report, serve, train, zoo

# click's UsageError (an unknown option, a missing argument, a value of the wrong type), or the copy of click that
# typer >= 0.2x vendors: whichever typer raises (its public BadParameter derives from it)
_UsageError: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


class _OneLineUsageErrors(TyperGroup):
    """The root group: a usage error anywhere below it is one `error:` line on stderr and exit code 2, as every
    other bad input (`perfmodel.cli.common.user_errors`), not rich's boxed panel."""

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except _UsageError as exc:
            _one_line(exc)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except _UsageError as exc:
            _one_line(exc)


def _one_line(exc: Any) -> NoReturn:
    if type(exc).__name__ == "NoArgsIsHelpError":  # a group without its command: the help, printed already
        raise exc
    message = " ".join(exc.format_message().split()).rstrip(".")
    hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
    typer.echo(f"error: {message}{hint}", err=True)
    raise typer.Exit(exc.exit_code)


app = typer.Typer(cls=_OneLineUsageErrors, no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False, help="perfmodel: what throughput will job X reach on placement Y?")
app.add_typer(zoo.zoo_app, name="zoo")
app.add_typer(profiles.profiles_app, name="profiles")
app.add_typer(hw.hw_app, name="hw")
app.add_typer(models.models_app, name="models")
app.add_typer(export.export_app, name="export")
app.add_typer(report.report_app, name="report")

app.command()(zoo.graph)
app.command()(profile.profile)
app.command("import")(importing.import_dataset)
app.command("adapt")(hw.adapt_command)
app.command()(train.train)
app.command("train-ops")(train.train_ops)
app.command()(train.evaluate)
app.command()(predict.predict)
app.command("predict-ops")(predict.predict_ops)
app.command("serve", context_settings=serve.CONTEXT_SETTINGS, add_help_option=False)(serve.serve)
app.command("retrain")(train.retrain)


def main() -> None:
    app()
