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

import typer

from perfmodel.cli import export, hw, importing, models, predict, profile, profiles, report, serve, train, zoo

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="perfmodel: what throughput will job X reach on placement Y?")
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
