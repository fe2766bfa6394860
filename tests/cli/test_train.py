"""`perfmodel train`, `train-ops` and `models list|promote` on a tiny real store (one CPU profile of a tiny user
module) and a temporary registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from perfmodel.cli.main import app

runner = CliRunner()
USER_MODELS = Path(__file__).parents[1] / "profilers" / "user_models.py"


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def models(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("PERFMODEL_MODELS_DIR", str(tmp_path / "models"))
    return tmp_path / "models"


def test_train_saves_promotes_and_lists(sqlite_url, models):
    profiled = run("profile", "--module", f"{USER_MODELS}:tiny_mlp", "-b", 2, "--warmup", 1, "--repeats", 3,
                   "--store", sqlite_url, "--json")
    assert profiled.exit_code == 0, profiled.output
    trained = run("train", "--regressor", "roofline", "--store", sqlite_url, "--promote")
    assert trained.exit_code == 0, trained.output
    assert "saved roofline/v1" in trained.stdout and "promoted" in trained.stdout
    assert (models / "roofline" / "v1").is_dir()
    assert run("train", "--regressor", "roofline", "--store", sqlite_url, "--name", "other").exit_code == 0
    listed = json.loads(run("models", "list", "--json").stdout)
    assert {(m["model"], m["promoted"]) for m in listed} == {("roofline/v1", True), ("other/v1", False)}
    assert run("models", "promote", "other/v1").exit_code == 0
    assert {m["model"] for m in json.loads(run("models", "list", "--json").stdout) if m["promoted"]} == {"other/v1"}


def test_bad_training_input_is_exit_2(sqlite_url, models):
    unknown = run("train", "--regressor", "nope", "--store", sqlite_url)
    assert unknown.exit_code == 2 and "nope" in unknown.output
    empty = run("train-ops", "--store", sqlite_url, "--sources", "neusight")
    assert empty.exit_code == 2 and "perfmodel import" in empty.output
    assert not models.exists()
