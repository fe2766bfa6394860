"""`perfmodel models promote|list` and `train --promote` against a store that already holds promotions: the CLI
promotes as `POST /v1/models/.../promote` does (a `promoted` event in the store, naming who asked, and
promoted.json), so `perfmodel predict` and a running service on that store follow it. A private copy of the
shipped registry with xgb-ops/v2 (a copy of v1) added; a fresh SQLite store."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from perfmodel.cli.main import app
from perfmodel.registry.registry import ModelRegistry
from perfmodel.store.jobs import JobStore
from tests.conftest import copy_shipped_models

runner = CliRunner()
USER_MODELS = Path(__file__).parents[1] / "profilers" / "user_models.py"


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def models(tmp_path, monkeypatch) -> Path:
    target = copy_shipped_models(tmp_path / "models")
    shutil.copytree(target / "xgb-ops" / "v1", target / "xgb-ops" / "v2")
    monkeypatch.setenv("PERFMODEL_MODELS_DIR", str(target))
    return target


def retrain_promoted(url: str, models: Path, ref: str) -> None:
    """What `perfmodel retrain` leaves after promoting `ref`: its model event in the store and promoted.json."""
    with JobStore(url) as store:
        ModelRegistry(models).promote(ref, store=store, by={"by": "retrain"})


def events(url: str) -> list:
    with JobStore(url) as store:
        return store.model_events()


def predicted_version(url: str) -> str:
    result = run("predict", "resnet18", "-b", 16, "--accelerator", "cpu", "--store", url, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["model_version"]


def test_cli_promotion_overrides_a_stored_promotion_for_predict_and_a_running_service(models, sqlite_url):
    from service.settings import ServiceSettings
    from tests.service.conftest import make_client

    retrain_promoted(sqlite_url, models, "xgb-ops/v2")
    assert predicted_version(sqlite_url) == "xgb-ops/v2"
    with make_client(ServiceSettings(store_url=sqlite_url, models_dir=models, sync_interval_s=0)) as client:
        assert client.get("/v1/models").json()["serving"]["cpu-step"] == "xgb-ops/v2"
        promoted = run("models", "promote", "xgb-ops/v1", "--store", sqlite_url)
        assert promoted.exit_code == 0, promoted.output
        assert "promoted xgb-ops/v1" in promoted.stdout
        client.app.state.service.sync_once()  # what every worker does every PERFMODEL_SYNC_INTERVAL_S
        listed = client.get("/v1/models").json()
        assert listed["serving"]["cpu-step"] == "xgb-ops/v1"
        flags = {m["model"]: (m["promoted"], m["serving"]) for m in listed["models"]}
        assert flags["xgb-ops/v1"] == (True, True) and flags["xgb-ops/v2"] == (False, False)
        newest = listed["events"][0]
        assert (newest["action"], newest["model_version"]) == ("promoted", "xgb-ops/v1")
    assert predicted_version(sqlite_url) == "xgb-ops/v1"
    assert json.loads((models / "promoted.json").read_text())["cpu-step"] == "xgb-ops/v1"
    detail = json.loads(events(sqlite_url)[0].detail)
    assert detail["by"] == "cli" and detail["command"] == "models promote" and detail["role"] == "cpu-step"
    assert detail["previous"] == "xgb-ops/v2" and detail["user"] and detail["host"]
    listed = json.loads(run("models", "list", "--store", sqlite_url, "--json").stdout)
    assert {m["model"] for m in listed if m["promoted"]} == set(json.loads((models / "promoted.json").read_text())
                                                                .values())


def test_models_list_marks_what_the_store_promotes(models, sqlite_url):
    retrain_promoted(sqlite_url, models, "xgb-ops/v2")
    (models / "promoted.json").write_text(json.dumps({"cpu-step": "xgb-ops/v1", "device-ops": "xgb-device-ops/v3"}))
    listed = json.loads(run("models", "list", "--store", sqlite_url, "--json").stdout)
    promoted = {m["model"] for m in listed if m["promoted"]}
    assert "xgb-ops/v2" in promoted and "xgb-ops/v1" not in promoted  # the store wins, as it does for predict
    # a store that never promoted anything: promoted.json says
    other = json.loads(run("models", "list", "--json").stdout)
    assert {m["model"] for m in other if m["promoted"]} == {"xgb-ops/v1", "xgb-device-ops/v3"}


def test_train_promote_is_recorded_in_its_store(sqlite_url, tmp_path, monkeypatch):
    monkeypatch.setenv("PERFMODEL_MODELS_DIR", str(tmp_path / "models"))
    profiled = run("profile", "--module", f"{USER_MODELS}:tiny_mlp", "-b", 2, "--warmup", 1, "--repeats", 3,
                   "--store", sqlite_url, "--json")
    assert profiled.exit_code == 0, profiled.output
    assert run("train", "--regressor", "roofline", "--store", sqlite_url, "--promote").exit_code == 0
    assert run("train", "--regressor", "roofline", "--store", sqlite_url).exit_code == 0  # roofline/v2, not promoted
    retrain_promoted(sqlite_url, tmp_path / "models", "roofline/v2")
    trained = run("train", "--regressor", "roofline", "--store", sqlite_url, "--promote")
    assert trained.exit_code == 0, trained.output
    assert "saved roofline/v3" in trained.stdout and "promoted" in trained.stdout
    (newest, *_) = events(sqlite_url)
    assert (newest.action, newest.model_version) == ("promoted", "roofline/v3")
    assert json.loads(newest.detail)["command"] == "train" and json.loads(newest.detail)["previous"] == "roofline/v2"
    listed = json.loads(run("models", "list", "--store", sqlite_url, "--json").stdout)
    assert {m["model"] for m in listed if m["promoted"]} == {"roofline/v3"}


def test_a_model_that_does_not_load_is_refused_in_one_line(models, sqlite_url):
    broken = models / "xgb-ops" / "v5"
    shutil.copytree(models / "xgb-ops" / "v1", broken)
    (broken / "model.ubj").write_bytes((models / "xgb-ops" / "v1" / "model.ubj").read_bytes()[:1000])  # truncated
    before = (models / "promoted.json").read_text()
    result = run("models", "promote", "xgb-ops/v5", "--store", sqlite_url)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: model xgb-ops/v5 was not promoted, its artifact does not load")
    assert "xgb-ops/v1 stays promoted" in line and "Traceback" not in result.output
    assert (models / "promoted.json").read_text() == before
    (event,) = events(sqlite_url)  # recorded as the service records a refusal
    assert (event.action, event.model_version) == ("refused", "xgb-ops/v5")
    assert predicted_version(sqlite_url) == "xgb-ops/v1"
    unknown = run("models", "promote", "xgb-ops/v9", "--store", sqlite_url)
    assert unknown.exit_code == 2 and "xgb-ops/v9" in unknown.stderr and len(unknown.stderr.splitlines()) == 1


def test_promoted_json_is_written_readable_as_the_shipped_one(models, sqlite_url):
    previous = os.umask(0o022)
    try:
        assert run("models", "promote", "xgb-ops/v2", "--store", sqlite_url).exit_code == 0
        assert (models / "promoted.json").stat().st_mode & 0o777 == 0o644
        os.umask(0o027)  # a stricter umask is respected, as for any file the process creates
        assert run("models", "promote", "xgb-ops/v1", "--store", sqlite_url).exit_code == 0
        assert (models / "promoted.json").stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(previous)
    assert not list(models.glob(".promoted.json.*.tmp"))
