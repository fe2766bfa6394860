"""`perfmodel retrain` on tiny real stores: op rows imported from small slices of the public NeuSight sweeps, and
profiles made by the real CPU profiler on tiny user modules; a temporary models dir. Exit codes: 0 promoted,
3 kept (champion better / too little held-out evidence / no new data), 1 failed (unreadable store, lock held),
2 bad options (a registry folder that does not exist, an unknown regressor)."""

from __future__ import annotations

import fcntl
import json
import os
import textwrap
from itertools import islice
from pathlib import Path

import pytest
from typer.testing import CliRunner

from perfmodel.cli.main import app
from perfmodel.core.errors import PerfmodelError
from perfmodel.evaluation.retrain import (
    LOCK_FILE,
    MIN_COMPARED_GROUPS,
    MIN_COMPARED_ROWS,
    RetrainSettings,
    held_out_groups,
)
from perfmodel.importers import ImportStats, get_importer
from perfmodel.jobs.spec import JobSpec
from perfmodel.registry.registry import ModelRegistry
from perfmodel.regressors.manifest import Manifest
from perfmodel.settings import get_settings
from perfmodel.store.jobs import JobStore

runner = CliRunner()
NEUSIGHT = get_settings().datasets_dir / "neusight"
GPUS = ("Tesla T4", "Tesla P4", "Tesla P100-PCIE-16GB", "Tesla V100-PCIE-32GB", "NVIDIA A100-PCIE-40GB")
# few trees, one thread: xgboost with 2 threads on a busy 2-core machine is ~5x slower than with one
FAST = ("--set", "device-ops=n_estimators:15", "--set", "device-ops=calibration_rows:400",
        "--set", "device-ops=nthread:1")


def neusight_slice(op: str, rows_per_gpu: int) -> list:
    """The first `rows_per_gpu` rows of NeuSight's sweep of `op` on each of GPUS, through the real importer."""
    if not NEUSIGHT.is_dir():
        pytest.skip(f"public dataset 'neusight' not found at {NEUSIGHT} (set PERFMODEL_DATASETS_DIR)")
    importer = get_importer("neusight")
    records = []
    for gpu in GPUS:
        file = f"data/dataset/train/collect/{op}/p2.1.0/{gpu}.csv.gz"
        records += list(islice(importer(NEUSIGHT, stats=ImportStats(), files=[file]), rows_per_gpu))
    return records


def run(*args):
    result = runner.invoke(app, ["retrain", *[str(a) for a in args]])
    return result


@pytest.fixture
def op_store(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with JobStore(url) as store:
        assert store.add_op_measurements(neusight_slice("linear", 80)) == 400
        job, _ = store.add_job(JobSpec.from_options(zoo="resnet18", batch_size=8))
        store.add_observation(job.key, placement={"accelerator": "t4"}, accelerator="t4", devices=1,
                              throughput_samples_per_s=100.0, predicted_throughput_samples_per_s=80.0,
                              model_version="xgb-device-ops/v3")
    return url


def versions(models: Path) -> list[str]:
    return sorted(p.parent.name + "/" + p.name for p in models.glob("*/v*") if p.is_dir())


def test_promoted_then_kept_without_new_data_then_kept_by_a_better_champion(op_store, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    report = tmp_path / "report.json"
    umask = os.umask(0o022)
    try:
        first = run("--store", op_store, "--models-dir", models, "--roles", "device-ops", "--report", report, *FAST)
    finally:
        os.umask(umask)
    assert first.exit_code == 0, first.output
    # what it wrote is readable as the shipped models are (a service may run as another user)
    assert (models / "xgb-device-ops" / "v1").stat().st_mode & 0o777 == 0o755
    for written in (models / "xgb-device-ops" / "v1" / "manifest.json", models / "promoted.json",
                    models / "retrain-state.json", report):
        assert written.stat().st_mode & 0o777 == 0o644, written
    data = json.loads(report.read_text())
    (role,) = data["roles"]
    assert data["status"] == "promoted" and role["decision"] == "promoted" and role["champion"] is None
    assert role["rows"] == 400 and 0 < role["held_out_rows"] < 400 and role["group_by"] == "chip"
    assert role["challenger_mape_pct"] > 0 and role["compared_rows"] == role["held_out_rows"]
    assert set(role["per_group"]) == set(role["held_out_groups"])
    assert role["challenger_mape_pct"] == pytest.approx(
        sum(g["challenger_mape_pct"] for g in role["per_group"].values()) / len(role["per_group"]))
    # observations posted to the service are read and summarised (served MAPE), not trained on
    assert data["observations"]["count"] == 1
    assert data["observations"]["by_accelerator"]["t4"]["served_mape_pct"] == pytest.approx(20.0)
    registry = ModelRegistry(models)
    ref = registry.promoted_ref("device-ops")
    assert ref == role["promoted"] == "xgb-device-ops/v1" and versions(models) == ["xgb-device-ops/v1"]
    manifest = Manifest.read(registry.get(ref).path)
    assert manifest.training_data_hash == role["data_hash"] and manifest.training_samples == 400
    assert manifest.metrics["retrain"]["held_out_groups"] == role["held_out_groups"]
    with JobStore(op_store) as store:
        (event,) = store.model_events()
    assert event.action == "promoted" and event.model_version == ref
    assert json.loads(event.detail)["role"] == "device-ops" and json.loads(event.detail)["by"] == "retrain"
    # what a running service follows: the engine serves each role's newest `promoted` event of the store
    from perfmodel.engine.models import ModelLifecycle

    with JobStore(op_store) as store:
        assert ModelLifecycle(registry, store, None, load=lambda refs: refs).store_promotions() == {"device-ops": ref}
    assert not list(models.glob("*/.retrain-tmp-*"))

    # same data: nothing trained, no new version, exit 3
    again = run("--store", op_store, "--models-dir", models, "--roles", "device-ops", "--report", report, *FAST)
    assert again.exit_code == 3, again.output
    (role,) = json.loads(report.read_text())["roles"]
    assert role["decision"] == "kept" and "no new data" in role["reason"] and role["challenger_mape_pct"] is None
    assert versions(models) == ["xgb-device-ops/v1"]

    # new data, but the challenger must be 99 % better than the champion on the same held-out rows (2 of the 5
    # chips: enough evidence to decide): kept
    with JobStore(op_store) as store:
        store.add_op_measurements(neusight_slice("softmax", 40))
    kept = run("--store", op_store, "--models-dir", models, "--roles", "device-ops", "--report", report,
               "--min-improvement-pct", 99, "--holdout-fraction", 0.4, *FAST)
    assert kept.exit_code == 3, kept.output
    (role,) = json.loads(report.read_text())["roles"]
    assert role["decision"] == "kept" and role["champion"] == ref and "99 % better" in role["reason"]
    assert role["compared_groups"] == 2 and role["compared_rows"] >= MIN_COMPARED_ROWS
    # the champion has no softmax booster: compared on the rows both predict (linear), the challenger's own rows
    assert role["compared_rows"] < role["held_out_rows"]
    assert role["champion_mape_pct"] > 0 and role["champion_trained_on_held_out"] is True
    assert role["required_mape_pct"] == pytest.approx(role["champion_mape_pct"] * 0.01)
    assert versions(models) == ["xgb-device-ops/v1"] and registry.promoted_ref("device-ops") == ref


def test_unreadable_store_fails_with_exit_1(tmp_path):
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database\n" * 100)
    report = tmp_path / "report.json"
    (tmp_path / "models").mkdir()
    result = run("--store", f"sqlite:///{garbage}", "--models-dir", tmp_path / "models", "--report", report)
    assert result.exit_code == 1, result.output
    data = json.loads(report.read_text())
    assert data["status"] == "failed" and "store" in data["error"] and data["roles"] == []


def test_a_held_lock_fails_the_second_run(op_store, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    with open(models / LOCK_FILE, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        result = run("--store", op_store, "--models-dir", models, "--roles", "device-ops")
    assert result.exit_code == 1 and "another retrain is running" in result.output
    assert versions(models) == []


def test_bad_options_exit_2(tmp_path):
    assert run("--roles", "nonsense", "--models-dir", tmp_path).exit_code == 2
    assert run("--holdout-fraction", 1.5, "--models-dir", tmp_path).exit_code == 2
    assert run("--set", "device-ops=n_estimators", "--models-dir", tmp_path).exit_code == 2
    for bad, named in ((("--regressor", "cpu-step=nope"), "nope"), (("--regressor", "device-ops=xgb-ops"), "xgb-ops"),
                       (("--regressor", "nope=xgb-ops"), "nope"), (("--set", "nope=n_estimators:5"), "nope")):
        result = run(*bad, "--models-dir", tmp_path)
        assert result.exit_code == 2, result.output
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("error: ") and named in line
    assert list(tmp_path.iterdir()) == []  # refused before any work


def test_a_registry_folder_that_does_not_exist_is_exit_2_naming_the_option(op_store, tmp_path, monkeypatch):
    missing = tmp_path / "no-such-registry"
    result = run("--store", op_store, "--models-dir", missing, "--roles", "device-ops", *FAST)
    assert result.exit_code == 2, result.output
    assert "--models-dir" in result.stderr and str(missing) in result.stderr
    monkeypatch.setenv("PERFMODEL_MODELS_DIR", str(missing))
    result = run("--store", op_store, "--roles", "device-ops", *FAST)
    assert result.exit_code == 2 and "PERFMODEL_MODELS_DIR" in result.stderr
    assert not missing.exists()
    with JobStore(op_store) as store:
        assert store.model_events() == []


def test_a_champion_is_kept_on_too_little_held_out_evidence(op_store, tmp_path):
    """The shipped device model is the champion; one held-out chip (the default fraction of 5 chips) is not enough
    evidence to replace it, whatever the MAPEs say."""
    from tests.conftest import copy_shipped_models

    models = copy_shipped_models(tmp_path / "models")
    champion, shipped = ModelRegistry(models).promoted_ref("device-ops"), versions(models)
    report = tmp_path / "report.json"
    result = run("--store", op_store, "--models-dir", models, "--roles", "device-ops", "--report", report,
                 "--min-improvement-pct", 0, *FAST)
    assert result.exit_code == 3, result.output
    data = json.loads(report.read_text())
    (role,) = data["roles"]
    assert role["decision"] == "kept" and role["champion"] == champion and role["promoted"] is None
    assert role["compared_groups"] == 1 < MIN_COMPARED_GROUPS and len(role["held_out_groups"]) == 1
    assert "too little held-out evidence" in role["reason"] and f"{MIN_COMPARED_ROWS} rows" in role["reason"]
    assert role["champion_mape_pct"] > 0 and role["challenger_mape_pct"] > 0  # both measured, and reported
    assert data["settings"]["min_compared_rows"] == MIN_COMPARED_ROWS
    assert ModelRegistry(models).promoted_ref("device-ops") == champion
    assert versions(models) == shipped  # no new version
    with JobStore(op_store) as store:
        assert store.model_events() == []


def test_held_out_groups_are_deterministic_and_never_all():
    groups = ["t4", "p4", "v100", "a100", "p100", "mi210"]
    held = held_out_groups(groups, 0.25, seed=0)
    assert held == held_out_groups(list(reversed(groups)), 0.25, seed=0) and len(held) == 2
    assert len(held_out_groups(["a", "b"], 0.9, seed=3)) == 1
    # groups the champion never saw are held out first: the comparison is fair where it can be
    for new in groups:
        assert new in held_out_groups(groups, 0.25, seed=0, seen=set(groups) - {new})
    with pytest.raises(PerfmodelError, match="at least 2 groups"):
        held_out_groups(["a", "a"], 0.5, seed=0)
    with pytest.raises(PerfmodelError):
        RetrainSettings(holdout_fraction=0)


USER_MODULE = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, {width}), nn.ReLU(), nn.Linear({width}, 10))

    def forward(self, x):
        return self.body(x)


def make(batch_size):
    return Net(), torch.randn(batch_size, 32)
"""


def test_default_role_learns_from_profiles_held_out_by_family(tmp_path):
    """Three families (one user module file each), profiled for real on this CPU; the iteration model is retrained
    with few trees and promoted for the `cpu-step` role."""
    from perfmodel.profilers.run import profile_job

    url = f"sqlite:///{tmp_path / 'store.db'}"
    with JobStore(url) as store:
        for i, width in enumerate((16, 64, 256)):
            path = tmp_path / f"family{i}.py"
            path.write_text(textwrap.dedent(USER_MODULE.format(width=width)))
            for batch in (4, 16):
                spec = JobSpec.from_options(module=f"{path}:make", batch_size=batch)
                store.add(profile_job(spec, "cpu", warmup=1, repeats=3, op_steps=1, time_budget_s=None))
    models, report = tmp_path / "models", tmp_path / "report.json"
    models.mkdir()
    args = ("--store", url, "--models-dir", models, "--roles", "cpu-step", "--report", report,
            "--set", "default=n_estimators:20", "--set", "default=inner_folds:2", "--set", "default=nthread:1")
    result = run(*args)
    assert result.exit_code == 0, result.output
    (role,) = json.loads(report.read_text())["roles"]
    assert role["decision"] == "promoted" and role["regressor"] == "xgb-ops" and role["group_by"] == "family"
    assert role["rows"] == 6 and role["held_out_rows"] == 2 and len(role["held_out_groups"]) == 1
    assert ModelRegistry(models).promoted_ref("cpu-step") == role["promoted"] == "xgb-ops/v1"
    assert run(*args).exit_code == 3 and versions(models) == ["xgb-ops/v1"]


def test_the_example_cronjob_runs_retrain_never_overlapping():
    import yaml

    manifest = yaml.safe_load((Path(__file__).parents[2] / "deploy" / "retrain-cronjob.yaml").read_text())
    assert manifest["kind"] == "CronJob" and manifest["apiVersion"] == "batch/v1"
    spec = manifest["spec"]
    assert spec["concurrencyPolicy"] == "Forbid"
    fields = spec["schedule"].split()
    assert len(fields) == 5 and all(f == "*" or f.isdigit() for f in fields)  # a valid cron line (daily here)
    (container,) = spec["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    command = " ".join(container["command"] + container["args"])
    assert "perfmodel retrain" in command and "--store" in command and "--models-dir /models" in command
    assert "-eq 3" in command  # "kept" is not a failed Job; "failed" (1) still is
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/models" in mounts and {"name": "PERFMODEL_MODELS_DIR", "value": "/models"} in container["env"]
    # the CLI accepts every option the manifest passes
    options = {word for word in command.split() if word.startswith("--")}
    help_text = runner.invoke(app, ["retrain", "--help"], terminal_width=200).output
    assert options and all(option in help_text for option in options)


def test_a_crash_while_saving_leaves_no_partial_version(op_store, tmp_path, monkeypatch):
    """The artifact is written to a temporary folder and renamed: a save that dies half-way leaves nothing a
    registry reader sees, and the next run clears the leftovers of a run that was killed outright."""
    from perfmodel.evaluation.retrain import retrain
    from perfmodel.regressors.device_ops import DeviceOpRegressor

    models = tmp_path / "models"
    stale = models / "xgb-device-ops" / ".retrain-tmp-killed"
    stale.mkdir(parents=True)
    (stale / "model-linear.ubj").write_bytes(b"half")

    def dies_half_way(self, directory, metrics=None):
        (Path(directory) / "model-linear.ubj").write_bytes(b"half an artifact")
        raise OSError("disk full")

    monkeypatch.setattr(DeviceOpRegressor, "save", dies_half_way)
    settings = RetrainSettings(roles=("device-ops",),
                               estimator_settings={"device-ops": {"n_estimators": 5, "nthread": 1}})
    result = retrain(op_store, models, settings)
    assert result.exit_code == 1 and result.roles[0].decision == "failed" and "disk full" in result.roles[0].reason
    assert versions(models) == [] and not list(models.glob("*/.retrain-tmp-*"))
    assert ModelRegistry(models).promoted_ref("device-ops") is None
