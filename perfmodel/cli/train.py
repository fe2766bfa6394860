"""Learning from the store: `perfmodel train` (an iteration-time regressor on profiles), `train-ops` (the per-op
device model on imported op measurements), `evaluate` (k-fold by model family) and `retrain` (the champion/challenger
job over the store, meant for cron or a Kubernetes CronJob: deploy/retrain-cronjob.yaml). The work is done by
perfmodel/evaluation/ (training.py, retrain.py); these commands parse options and print."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from perfmodel.cli.common import StoreOpt, out, say, user_errors, writable_folder
from perfmodel.core.errors import PerfmodelError
from perfmodel.core.renamed import RENAMED_ROLES
from perfmodel.evaluation.training import DEVICE_OPS_SOURCES

Opt = typer.Option
ProfilesDirOpt = Annotated[Optional[Path], typer.Option(
    "--profiles", help="a Parquet export to learn from \\[profiles/cpu-corpus]; --store reads a store instead")]


@user_errors
def train(regressor: Annotated[str, typer.Option(help="roofline, xgb-ops, xgb-graph or gnn")] = "xgb-ops",
          name: Annotated[Optional[str], typer.Option(help="registry name \\[the regressor's]")] = None,
          promote: Annotated[bool, typer.Option(help="promote it for its role, as `perfmodel models promote` "
                                                     "does (recorded in the --store store)")] = False,
          seed: Annotated[int, typer.Option(help="random seed")] = 0,
          profiles: ProfilesDirOpt = None, store: StoreOpt = None) -> None:
    """Train a regressor on the profile corpus and save it to the registry (seeded, reproducible). With --promote
    it is promoted as `perfmodel models promote` does: in the store (--store, else the default one) that services
    and `perfmodel predict` follow, and in the registry's promoted.json."""
    from perfmodel.cli.models import promote_recorded
    from perfmodel.evaluation.training import train_iteration_model, training_samples
    from perfmodel.regressors import regressor_class

    regressor_class(regressor, iteration=True)  # an unknown name fails before the corpus is read
    entry = train_iteration_model(regressor, training_samples(profiles, store, progress=say), name=name, seed=seed,
                                  promote=False, progress=say)
    if promote:
        entry = promote_recorded(entry.ref, store, command="train")
    out.print(f"saved {entry.ref} ({entry.path})" + (" and promoted it" if promote else ""))


@user_errors
def train_ops(store: StoreOpt = None,
              sources: Annotated[str, typer.Option(help="comma-separated import sources to learn from")] =
              ",".join(DEVICE_OPS_SOURCES),
              name: Annotated[str, typer.Option(help="registry name")] = "xgb-device-ops",
              promote: Annotated[bool, typer.Option(help="make it the promoted device-ops model, as `perfmodel "
                                                         "models promote` does (recorded in the --store store)")
                                 ] = False,
              seed: Annotated[int, typer.Option(help="random seed")] = 0) -> None:
    """Train the per-op device regressor (xgb-device-ops) on imported GPU measurements (`perfmodel import`)."""
    from perfmodel.cli.models import promote_recorded
    from perfmodel.evaluation.training import train_device_ops_model

    entry = train_device_ops_model(store, sources.split(","), name=name, seed=seed, promote=False, progress=say)
    if promote:
        entry = promote_recorded(entry.ref, store, command="train-ops", role="device-ops")
    out.print(f"saved {entry.ref} ({entry.path})" + (" and promoted it for device-ops" if promote else ""))


@user_errors
def evaluate(regressors: Annotated[str, typer.Option(help="comma-separated")] = "roofline,xgb-ops,xgb-graph,gnn",
             folds: Annotated[int, typer.Option("-k", "--folds", min=2, help="family folds")] = 5,
             output: Annotated[Path, typer.Option(help="report folder")] = Path("reports"),
             seed: Annotated[int, typer.Option(help="random seed")] = 0,
             profiles: ProfilesDirOpt = None, store: StoreOpt = None) -> None:
    """k-fold by model family (a family is never in both train and test): MAPE, median and p90 APE per family
    and regressor, 80 % interval coverage; writes report.md and PNG plots."""
    from perfmodel.evaluation import evaluate as run_evaluation
    from perfmodel.evaluation import write_report
    from perfmodel.evaluation.training import seeded, training_samples
    from perfmodel.regressors import regressor_class

    names = [n.strip() for n in regressors.split(",") if n.strip()]
    factories = {n: seeded(regressor_class(n, iteration=True), seed) for n in names}
    samples = training_samples(profiles, store, progress=say)
    result = run_evaluation(factories, samples, k=folds, seed=seed)
    paths = write_report(result, output)
    sys.stdout.write(paths["report"].read_text())
    out.print(f"[dim]report, predictions and plots in {output}/[/]")



def _role_values(items: list[str], option: str, parse: Any) -> dict[str, Any]:
    """`ROLE=VALUE` items (repeatable option) as {role: parse(value)}."""
    values: dict[str, Any] = {}
    for item in items:
        role, sep, value = item.partition("=")
        if not sep or not role or not value:
            raise PerfmodelError(f"{option}: expected ROLE=VALUE, got {item!r}")
        role = RENAMED_ROLES.get(role.strip(), role.strip())
        values[role] = parse(value.strip(), values.get(role))
    return values


def _setting(value: str, previous: dict[str, Any] | None) -> dict[str, Any]:
    name, sep, raw = value.partition(":")
    if not sep or not name:
        raise PerfmodelError(f"--set: expected ROLE=PARAM:VALUE (e.g. device-ops=n_estimators:60), got {value!r}")
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        parsed = raw
    return {**(previous or {}), name: parsed}


def retrain(
        store: Annotated[Optional[str], Opt("--store", help="store URL \\[env PERFMODEL_STORE_URL, default SQLite "
                                                             "under PERFMODEL_HOME]")] = None,
        models_dir: Annotated[Optional[Path], Opt("--models-dir", help="model registry, an existing folder \\[env "
                                                                       "PERFMODEL_MODELS_DIR, the shipped models/]")
                              ] = None,
        report: Annotated[Optional[Path], Opt("--report", help="write the JSON report here (atomically)")] = None,
        roles: Annotated[str, Opt(help="roles to retrain, comma-separated: cpu-step, device-ops, whole-step "
                                       "(the stage learned from whole-job runs: perfmodel import lambda)")
                         ] = "cpu-step,device-ops",
        min_improvement_pct: Annotated[float, Opt(help="promote only a challenger whose held-out MAPE is this % "
                                                       "(relative) below the champion's")] = 2.0,
        holdout_fraction: Annotated[float, Opt(help="fraction of the groups (families, chips) held out")] = 0.25,
        seed: Annotated[int, Opt(help="seed of the split and the regressors")] = 0,
        regressor: Annotated[Optional[list[str]], Opt(
            "--regressor", help="ROLE=NAME: the challenger's regressor kind (default: the champion's), "
                                "repeatable")] = None,
        setting: Annotated[Optional[list[str]], Opt(
            "--set", help="ROLE=PARAM:VALUE overriding the champion's estimator settings, e.g. "
                          "device-ops=n_estimators:60; repeatable")] = None,
        force: Annotated[bool, Opt(help="evaluate even when the data did not change")] = False,
        gpu_report: Annotated[Optional[Path], Opt("--gpu-report", help="with the whole-step role: write the GPU "
                                                  "accuracy report (perfmodel report gpu-accuracy) of the store's "
                                                  "whole-job runs in this folder")] = None,
        as_json: Annotated[bool, Opt("--json", help="print the report on stdout")] = False,
) -> None:
    """Retrain every role's model on everything in the store and promote a challenger only if it beats the
    promoted model (champion) on the same held-out split, by model family (profiles) or chip (op measurements).

    Idempotent: unchanged data trains nothing and adds no version. Safe from cron: a lock stops overlapping runs;
    new versions are written to a temporary folder and renamed into place. A champion is replaced only on at least
    10 held-out rows of at least 2 groups. A promotion is recorded in the store, which services and `perfmodel
    predict` on it follow, and in the registry's promoted.json.

    Exit codes: 0 a challenger was promoted; 3 kept (every champion was better, the held-out evidence too little
    to replace it, or there was no new data);
    1 failed (a role failed, the store could not be read, or another run holds the lock); 2 bad options."""
    from perfmodel.core.atomic import write_json_atomically
    from perfmodel.evaluation.retrain import RetrainSettings
    from perfmodel.evaluation.retrain import retrain as run_retrain
    from perfmodel.registry.registry import default_models_dir

    @user_errors  # here, not on the command: its own exit codes 0, 1 and 3 pass through
    def settings() -> RetrainSettings:
        chosen = RetrainSettings(
            min_improvement_pct=min_improvement_pct, holdout_fraction=holdout_fraction, seed=seed,
            roles=tuple(RENAMED_ROLES.get(r.strip(), r.strip()) for r in roles.split(",") if r.strip()),
            regressors=_role_values(regressor or [], "--regressor", lambda value, _: value),
            estimator_settings=_role_values(setting or [], "--set", _setting), force=force,
            gpu_report_dir=gpu_report)
        if report is not None:
            writable_folder(report)
        root = models_dir if models_dir is not None else default_models_dir()
        if not root.is_dir():
            where = "--models-dir" if models_dir is not None else \
                "PERFMODEL_MODELS_DIR" if os.environ.get("PERFMODEL_MODELS_DIR") else "the shipped models/"
            raise PerfmodelError(f"{where}: no model registry at {root} (no such folder; retrain never creates "
                                 "one: give an existing registry, e.g. a copy of the shipped models/)")
        return chosen

    result = run_retrain(store, models_dir, settings(), progress=say)
    data = result.to_json()
    if report is not None:
        write_json_atomically(report, data, make_parents=False)
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    else:
        for outcome in result.roles:
            typer.echo(f"{outcome.role}: {outcome.decision}"
                       + (f" {outcome.promoted}" if outcome.promoted else "") + f": {outcome.reason}")
    if result.error is not None:
        typer.echo(f"error: {result.error}", err=True)
    raise typer.Exit(result.exit_code)
