"""`perfmodel retrain`: the champion/challenger retraining job over the store (perfmodel/evaluation/retrain.py), meant
for cron or a Kubernetes CronJob (deploy/retrain-cronjob.yaml)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from perfmodel.core.errors import PerfmodelError

Opt = typer.Option


def _role_values(items: list[str], option: str, parse: Any) -> dict[str, Any]:
    """`ROLE=VALUE` items (repeatable option) as {role: parse(value)}."""
    out: dict[str, Any] = {}
    for item in items:
        role, sep, value = item.partition("=")
        if not sep or not role or not value:
            raise PerfmodelError(f"{option}: expected ROLE=VALUE, got {item!r}")
        out[role.strip()] = parse(value.strip(), out.get(role.strip()))
    return out


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
        store: Annotated[Optional[str], Opt("--store", help="store URL [env PERFMODEL_STORE_URL, default SQLite "
                                                             "under PERFMODEL_HOME]")] = None,
        models_dir: Annotated[Optional[Path], Opt("--models-dir", help="model registry [env PERFMODEL_MODELS_DIR, "
                                                                       "the shipped models/]")] = None,
        report: Annotated[Optional[Path], Opt("--report", help="write the JSON report here (atomically)")] = None,
        roles: Annotated[str, Opt(help="comma-separated roles to retrain: default, device-ops")] = "default,device-ops",
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
        as_json: Annotated[bool, Opt("--json", help="print the report on stdout")] = False,
) -> None:
    """Retrain every role's model on everything in the store and promote a challenger only if it beats the
    promoted model (champion) on the same held-out split, by model family (profiles) or chip (op measurements).

    Idempotent: unchanged data trains nothing and adds no version. Safe from cron: a lock stops overlapping runs;
    new versions are written to a temporary folder and renamed into place.

    Exit codes: 0 a challenger was promoted; 3 kept (every champion was better, or there was no new data);
    1 failed (a role failed, the store could not be read, or another run holds the lock); 2 bad options."""
    from perfmodel.cli.main import err, user_errors
    from perfmodel.core.atomic import write_json_atomically
    from perfmodel.evaluation.retrain import RetrainSettings
    from perfmodel.evaluation.retrain import retrain as run_retrain

    @user_errors
    def settings() -> RetrainSettings:
        return RetrainSettings(
            min_improvement_pct=min_improvement_pct, holdout_fraction=holdout_fraction, seed=seed,
            roles=tuple(r.strip() for r in roles.split(",") if r.strip()),
            regressors=_role_values(regressor or [], "--regressor", lambda value, _: value),
            estimator_settings=_role_values(setting or [], "--set", _setting), force=force)

    chosen = settings()
    if report is not None and not report.parent.is_dir():
        typer.echo(f"error: cannot write {report}: no such folder {report.parent}", err=True)
        raise typer.Exit(2)
    result = run_retrain(store, models_dir, chosen, progress=lambda m: err.print(f"[dim]{m}[/]", highlight=False))
    data = result.to_json()
    if report is not None:
        write_json_atomically(report, data)
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    else:
        for outcome in result.roles:
            typer.echo(f"{outcome.role}: {outcome.decision}"
                       + (f" {outcome.promoted}" if outcome.promoted else "") + f": {outcome.reason}")
    if result.error is not None:
        typer.echo(f"error: {result.error}", err=True)
    raise typer.Exit(result.exit_code)
