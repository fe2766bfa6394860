"""The engine's model lifecycle: promotion state in the store (every worker follows it), pins that survive sync,
concurrent promotions that lose nothing. Real models (copies of the shipped registry), real SQLite stores."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest

from perfmodel.engine import EngineConfig, PredictionEngine, Refused
from perfmodel.registry.registry import default_models_dir
from perfmodel.store.jobs import JobStore
from tests.conftest import copy_shipped_models


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    """The shipped registry plus xgb-ops/v2 (a copy of v1: a second model of the `cpu-step` role)."""
    target = tmp_path / "models"
    copy_shipped_models(target)
    shutil.copytree(target / "xgb-ops" / "v1", target / "xgb-ops" / "v2")
    return target


# the shipped whole-step stage, untouched by these promotions
WHOLE = {"whole-step": json.loads((default_models_dir() / "promoted.json").read_text())["whole-step"]}


def _open(models_dir: Path, url: str, model_version: str | None = None) -> PredictionEngine:
    return PredictionEngine.open(EngineConfig(models_dir=models_dir, model_version=model_version), JobStore(url))


def test_a_pinned_version_survives_sync_and_refuses_promotions_of_its_role(models_dir, tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    pinned = _open(models_dir, url, model_version="xgb-device-ops/v2")
    other = _open(models_dir, url)
    assert pinned.model_versions == {"cpu-step": "xgb-ops/v1", "device-ops": "xgb-device-ops/v2", **WHOLE}
    shipped = json.loads((default_models_dir() / "promoted.json").read_text())["device-ops"]
    assert other.model_versions == {"cpu-step": "xgb-ops/v1", "device-ops": shipped, **WHOLE}
    other.promote("xgb-device-ops/v3")  # the pinned role, promoted elsewhere (an earlier release)
    other.promote("xgb-ops/v2")  # the other role
    pinned.sync_once()
    assert pinned.model_versions == {"cpu-step": "xgb-ops/v2", "device-ops": "xgb-device-ops/v2", **WHOLE}
    with pytest.raises(Refused, match="pins xgb-device-ops/v2"):
        pinned.promote("xgb-device-ops/v3")
    pinned.sync_once()
    assert pinned.model_versions["device-ops"] == "xgb-device-ops/v2"


def test_two_workers_promoting_at_once_lose_nothing_and_every_worker_follows_the_store(models_dir, tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    first, second = _open(models_dir, url), _open(models_dir, url)
    start = threading.Barrier(2)
    answers: dict[str, object] = {}

    def promote(engine: PredictionEngine, ref: str) -> None:
        start.wait()
        try:
            answers[ref] = engine.promote(ref)
        except Exception as exc:
            answers[ref] = exc

    threads = [threading.Thread(target=promote, args=(first, "xgb-ops/v2")),
               threading.Thread(target=promote, args=(second, "xgb-device-ops/v2"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(isinstance(a, dict) for a in answers.values()), answers
    first.sync_once()
    second.sync_once()
    expected = {"cpu-step": "xgb-ops/v2", "device-ops": "xgb-device-ops/v2", **WHOLE}
    assert first.model_versions == second.model_versions == expected
    assert json.loads((models_dir / "promoted.json").read_text()) == expected  # the CLI's view lost nothing either
    events = JobStore(url).model_events()
    promoted_here = ("xgb-ops/v2", "xgb-device-ops/v2")
    assert sorted(e.model_version for e in events if e.action == "promoted") == sorted(promoted_here)
    # the store, not a host's promoted.json, is what a new worker or replica serves
    (models_dir / "promoted.json").write_text(json.dumps({"cpu-step": "xgb-ops/v1",
                                                          "device-ops": "xgb-device-ops/v3", **WHOLE}))
    assert _open(models_dir, url).model_versions == expected
    assert not list(models_dir.glob(".promoted.json.*.tmp"))  # no temporary file left behind
